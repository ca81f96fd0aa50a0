"""cifar10_resnet, text_transformer and gpt in one process: augmentation,
tokenizer, models, the embedding's sparse gradient through hvdtrain's
optimizer, and gpt's corpora (TFDS bytes, the synthetic language)."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from hvdtrain.recipes import cifar10_resnet, text_transformer

import hvdtrain
import tfds_data
from hvdtrain import recipe
from hvdtrain.errors import UsageError
from hvdtrain.parallel.data_parallel.optimizer import DistributedOptimizer

TINY_TRANSFORMER = dict(vocab_size=1000, sequence_length=32, d_model=16, layers=1, heads=2,
                        mlp_dim=32, dropout=0.0)


def test_training_preprocess_pads_crops_and_flips_by_the_seed():
    image = tf.constant(np.random.default_rng(0).integers(0, 256, (32, 32, 3)), tf.uint8)
    padded = np.pad(cifar10_resnet.normalize(image).numpy(), [[4, 4], [4, 4], [0, 0]])
    windows = {}
    for dy in range(9):
        for dx in range(9):
            window = padded[dy:dy + 32, dx:dx + 32]
            windows[(dy, dx, False)], windows[(dy, dx, True)] = window, window[:, ::-1]
    drawn = []
    for k in range(12):
        augmented, label = cifar10_resnet.preprocess(
            {"image": image, "label": tf.constant(3, tf.int64)}, tf.constant([7, k], tf.int64))
        assert augmented.shape == (32, 32, 3) and augmented.dtype == tf.float32 and label == 3
        # Each output is exactly one window of the zero-padded normalized image, maybe mirrored.
        drawn.append(next(key for key, window in windows.items()
                          if np.array_equal(window, augmented.numpy())))
    assert len(set(drawn)) > 6, drawn
    assert {flip for _, _, flip in drawn} == {False, True}
    # The same seed, the same draw.
    again, _ = cifar10_resnet.preprocess({"image": image, "label": 3},
                                         tf.constant([7, 0], tf.int64))
    assert np.array_equal(again, windows[drawn[0]])


def test_evaluation_preprocess_only_normalizes():
    image = tf.constant(np.random.default_rng(1).integers(0, 256, (32, 32, 3)), tf.uint8)
    first, _ = cifar10_resnet.preprocess({"image": image, "label": 0}, None)
    second, _ = cifar10_resnet.preprocess({"image": image, "label": 0}, None)
    assert np.array_equal(first, second)
    expected = (image.numpy() / 255.0 - cifar10_resnet.MEAN) / cifar10_resnet.STD
    np.testing.assert_allclose(first, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("depth, weight_layers", [(8, 8), (20, 20), (56, 56)])
def test_cifar_resnet_has_6n_plus_2_weight_layers(depth, weight_layers):
    config = recipe.make_config("cifar10_resnet", options={"depth": depth})
    model = cifar10_resnet.build_model(config)
    layers = [layer for layer in model.layers
              if isinstance(layer, (keras.layers.Conv2D, keras.layers.Dense))]
    assert len(layers) == weight_layers
    assert model.output_shape == (None, 10)
    if depth == 20:
        # The paper's ResNet-20: 0.27M parameters (option A shortcuts add none).
        assert 0.265e6 < model.count_params() < 0.275e6, model.count_params()
    # One L2 penalty per kernel, in the loss.
    model(np.zeros((1, 32, 32, 3), np.float32))
    assert len(model.losses) == weight_layers


def test_cifar_resnet_refuses_a_depth_that_is_not_6n_plus_2():
    config = recipe.make_config("cifar10_resnet", options={"depth": 21})
    with pytest.raises(UsageError, match="depth 6n\\+2"):
        cifar10_resnet.build_model(config)


def test_cifar_recipe_reads_a_tfds_directory_in_whole_files(tmp_path):
    hvdtrain.init()
    tfds_data.write("cifar10", tmp_path, {"train": tfds_data.cifar10_examples(96),
                                          "test": tfds_data.cifar10_examples(40, seed=1)})
    config = recipe.make_config("cifar10_resnet", data_dir=str(tmp_path), batch_size=32)
    splits = cifar10_resnet.load_data(config)
    assert (splits.train.steps, splits.validation.steps) == (3, 2)
    images, labels = next(iter(splits.train.batches(0)))
    assert images.shape == (32, 32, 32, 3) and images.dtype == tf.float32
    assert sorted(int(label) for _, batch in splits.validation.batches() for label in batch) == \
        sorted(i % 10 for i in range(40))


def test_tokenizer_lowercases_strips_markup_and_punctuation_and_hashes_words():
    review = tf.constant("Great MOVIE!<br /><br />It's... great, isn’t it? “Great”")
    tokens = text_transformer.tokenize(review, 1000, 12).numpy()
    words = ["great", "movie", "its", "great", "isnt", "it", "great"]
    hashed = tf.strings.to_hash_bucket_fast(words, 998).numpy() + 2
    assert list(tokens) == [1, *hashed, 0, 0, 0, 0]
    assert tokens[1] == tokens[4] == tokens[7]
    assert tokens.dtype == np.int32


def test_tokenizer_cuts_long_reviews_and_keeps_ids_in_the_vocabulary():
    text = tf.constant(" ".join(f"word{i}" for i in range(500)))
    tokens = text_transformer.tokenize(text, 50, 16).numpy()
    assert tokens.shape == (16,) and tokens[0] == 1 and (tokens[1:] >= 2).all()
    assert (tokens < 50).all()
    empty = text_transformer.tokenize(tf.constant("<br />!!"), 50, 4).numpy()
    assert list(empty) == [1, 0, 0, 0]


def test_transformer_ignores_padding():
    config = recipe.make_config("text_transformer", options=TINY_TRANSFORMER)
    model = text_transformer.build_model(config)
    tokens = np.array([[1, 5, 9, 9, 3] + [0] * 11, [1, 7] + [0] * 14])
    short, long = model(tokens), model(np.pad(tokens, [[0, 0], [0, 16]]))
    assert short.shape == (2, 2)
    np.testing.assert_allclose(short, long, rtol=1e-5, atol=1e-6)
    # Yet the tokens matter.
    assert not np.allclose(short, model(np.where(tokens > 1, tokens + 1, tokens)))


def _embedding_gradients(model, tokens, labels):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(tokens, training=True))
    return tape.gradient(loss, model.trainable_variables)


def test_embedding_gradient_is_sparse_and_adam_applies_it_as_the_dense_one():
    hvdtrain.init()
    config = recipe.make_config("text_transformer", options=TINY_TRANSFORMER)
    keras.utils.set_random_seed(0)
    model = text_transformer.build_model(config)
    # Words repeat within the batch: the sparse gradient has duplicate rows.
    tokens = np.array([[1, 5, 9, 9, 3, 0, 0, 0], [1, 9, 5, 4, 4, 4, 0, 0]], np.int32)
    grads = _embedding_gradients(model, tokens, np.array([0, 1]))
    table = model.get_layer("embedding").tokens.embeddings
    index = [v.path for v in model.trainable_variables].index(table.path)
    assert isinstance(grads[index], tf.IndexedSlices)
    assert sum(isinstance(g, tf.IndexedSlices) for g in grads) == 1
    assert len(np.unique(grads[index].indices)) < len(grads[index].indices)

    start = [v.numpy() for v in model.trainable_variables]
    results = []
    for sparse in (True, False):
        for variable, value in zip(model.trainable_variables, start):
            variable.assign(value)
        optimizer = DistributedOptimizer(keras.optimizers.Adam(0.01))
        applied = grads if sparse else [tf.convert_to_tensor(g) for g in grads]
        for _ in range(3):
            optimizer.apply(applied, model.trainable_variables)
        results.append(table.numpy())
    changed = np.flatnonzero((results[0] != start[index]).any(axis=1))
    assert set(changed) == {1, 3, 4, 5, 9}  # the rows of the batch's tokens, not the padding
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6, atol=1e-7)


def test_transformer_refuses_heads_that_do_not_divide_the_width():
    config = recipe.make_config("text_transformer", options=dict(TINY_TRANSFORMER, heads=3))
    with pytest.raises(UsageError, match="multiple of --option=heads=3"):
        text_transformer.build_model(config)


def test_text_recipe_reads_reviews_as_token_ids(tmp_path):
    hvdtrain.init()
    tfds_data.write("imdb_reviews", tmp_path, {"train": tfds_data.imdb_reviews_examples(64),
                                               "test": tfds_data.imdb_reviews_examples(20)})
    config = recipe.make_config("text_transformer", data_dir=str(tmp_path), batch_size=16,
                                options=TINY_TRANSFORMER)
    splits = text_transformer.load_data(config)
    assert (splits.train.steps, splits.validation.steps) == (4, 2)
    tokens, labels = next(iter(splits.train.batches(0)))
    assert tokens.shape == (16, 32) and tokens.dtype == tf.int32
    assert (tokens.numpy()[:, 0] == 1).all() and set(labels.numpy()) <= {0, 1}
    model = text_transformer.build_model(config)
    assert model(tokens).shape == (16, 2)


def test_gpt_reads_tiny_shakespeare_as_bytes(tmp_path):
    from hvdtrain.recipes import gpt

    hvdtrain.init()
    text = "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 20
    tfds_data.write("tiny_shakespeare", tmp_path, {"train": [{"text": text}],
                                                   "validation": [{"text": text[:400]}],
                                                   "test": [{"text": text[:100]}]},
                    files_per_split=1)
    config = recipe.make_config("gpt", data_dir=str(tmp_path), batch_size=4, options=dict(
        dataset="tiny_shakespeare", vocab_size=256, sequence_length=15))
    splits = gpt.load_data(config)
    assert splits.train.examples == len(text) // 16 and splits.validation.examples == 400 // 16
    inputs, targets = next(iter(splits.validation.batches(0)))   # in order
    sent = np.frombuffer(text[:32].encode(), np.uint8)
    np.testing.assert_array_equal(inputs.numpy()[:2], [sent[:15], sent[16:31]])
    np.testing.assert_array_equal(targets.numpy()[:2], [sent[1:16], sent[17:32]])


def test_gpt_knows_its_synthetic_languages_baseline_and_floor():
    from hvdtrain.recipes import gpt

    train, validation, language = gpt.synthetic_corpus(64, 4, 32, 2048, 256, 0)
    assert train.shape == (2048, 33) and validation.shape == (256, 33)
    # Only the language's successors follow each token.
    pairs = set(zip(train[:, 1:-1].ravel(), train[:, 2:].ravel()))
    assert all(c in language.successors[b] for b, c in pairs)
    unigram = gpt.unigram_cross_entropy(train, validation, 64)
    floor = language.cross_entropy(validation)
    assert 0.9 * np.log(64) < unigram <= np.log(64) + 0.01
    assert 0.5 < floor < np.log(4)   # 4 successors, unequal chances
    # An estimate of the language from its own training text does no better.
    counts = np.ones((64, 64, 64))
    np.add.at(counts, (train[:, :-2], train[:, 1:-1], train[:, 2:]), 1)
    estimate = counts / counts.sum(-1, keepdims=True)
    a, b, c = validation[:, :-2], validation[:, 1:-1], validation[:, 2:]
    assert -np.log(estimate[a, b, c]).mean() > floor


def test_gpt_refuses_sizes_its_split_layers_cannot_share():
    for option, value in (("heads", 3), ("vocab_size", 129), ("mlp_dim", 255)):
        options = {option: value, "d_model": 66} if option == "heads" else {option: value}
        with pytest.raises(UsageError, match=f"--option={option}={value} does not split over "
                                             "--tensor_parallel=2 ranks"):
            recipe.make_config("gpt", options=options, tensor_parallel=2)
