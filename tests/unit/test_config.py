import dataclasses

import pytest

from hvdtrain import config
from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError


def test_override_keeps_values_given_as_none():
    config = TrainConfig(epochs=3).override(epochs=None, batch_size=8)
    assert (config.epochs, config.batch_size) == (3, 8)


def test_override_rejects_unknown_settings():
    with pytest.raises(UsageError, match="unknown setting"):
        TrainConfig().override(batchsize=8)


@pytest.mark.parametrize("values, message", [
    (dict(batch_size=0), "--batch_size must be positive, got 0"),
    (dict(epochs=-2), "--epochs must be positive, got -2"),
    (dict(learning_rate=0.0), "--learning_rate must be positive"),
    (dict(warmup_epochs=-1.0), "--warmup_epochs must be >= 0"),
    (dict(intra_op_threads=-1), "--intra_op_threads must be >= 0"),
    (dict(optimizer="adamm"), "unknown --optimizer=adamm; choose one of sgd, rmsprop, adam, "
                              "adamw"),
    (dict(optimizer="adam", nesterov=True), "--nesterov applies to --optimizer=sgd, not adam"),
    (dict(clipnorm=1.0, clipvalue=0.5), "--clipnorm and --clipvalue are both set"),
    (dict(clipnorm=0.0), "--clipnorm must be positive, got 0.0"),
    (dict(weight_decay=-0.1), "--weight_decay must be >= 0, got -0.1"),
    (dict(ema_momentum=1.0), "--ema_momentum must be in [0, 1), got 1.0"),
    (dict(early_stopping_patience=3, best_metric=""),
     "--early_stopping_patience watches --best_metric, which is empty"),
    (dict(lr_schedule="plateau", best_metric=""),
     "--lr_schedule=plateau watches --best_metric, which is empty"),
    (dict(plateau_factor=1.0), "--plateau_factor must be in (0, 1), got 1.0"),
    (dict(profile_steps="5"), "--profile_steps=5 is not FIRST:LAST with 1 <= FIRST <= LAST"),
    (dict(momentum=1.0), "--momentum must be in [0, 1)"),
    (dict(verbose=3), "--verbose must be in [0, 2], got 3"),
    (dict(keep_checkpoints=-1), "--keep_checkpoints must be >= 0"),
    (dict(allreduce_groups=-1), "--allreduce_groups must be >= 0"),
    (dict(lr_schedule="linear"),
     "unknown --lr_schedule=linear; choose one of constant, cosine, step, plateau"),
    (dict(throughput_window_steps=0), "--throughput_window_steps must be positive"),
    (dict(timeline_steps="20"), "--timeline_steps=20 is not FIRST:LAST with 1 <= FIRST <= LAST"),
    (dict(timeline_steps="9:3"), "--timeline_steps=9:3 is not FIRST:LAST"),
    (dict(timeline_steps="0:3"), "--timeline_steps=0:3 is not FIRST:LAST"),
    (dict(checkpoint_steps=-5), "--checkpoint_steps must be >= 0"),
    (dict(nan_policy="skip"), "unknown --nan_policy=skip; choose one of fail, ignore"),
    (dict(elastic_commit_steps=0), "--elastic_commit_steps must be positive, got 0"),
])
def test_validate_names_the_bad_setting(values, message):
    with pytest.raises(UsageError) as error:
        TrainConfig(**values).validate()
    assert message in str(error.value)


def test_defaults_are_valid():
    assert TrainConfig().validate() == TrainConfig()


@pytest.mark.parametrize("values, message", [
    (dict(warmup_epochs=float("nan")), "--warmup_epochs must be >= 0, got nan"),
    (dict(learning_rate=float("inf")), "--learning_rate must be positive, got inf"),
    (dict(stall_timeout=float("inf")), "--stall_timeout must be >= 0, got inf"),
    (dict(momentum=float("nan")), "--momentum must be in [0, 1), got nan"),
    (dict(seed=-1), "--seed must be in [0, 4294967296), got -1"),
    (dict(epochs=2.5), "--epochs must be an integer, got 2.5"),
    (dict(batch_size=True), "--batch_size must be an integer, got True"),
    (dict(learning_rate="0.1"), "--learning_rate must be a number, got '0.1'"),
])
def test_numbers_must_be_finite_of_their_type_and_in_range(values, message):
    with pytest.raises(UsageError) as error:
        TrainConfig(**values).validate()
    assert str(error.value) == message


def test_every_numeric_setting_declares_its_range():
    # A numeric setting without one would take NaN, infinities and negatives unchecked.
    numeric = [f for f in dataclasses.fields(TrainConfig)
               if f.type in (int, float, int | None, float | None)]
    assert numeric and all("range" in f.metadata for f in numeric), [
        f.name for f in numeric if "range" not in f.metadata]


def test_every_compression_name_is_an_algorithm_of_compression():
    from hvdtrain.parallel.data_parallel.compression import Compression

    algorithms = {name for name in vars(Compression) if not name.startswith("_")}
    assert set(config.COMPRESSIONS) == algorithms


def test_the_optimizers_are_every_optimizer_keras_has():
    import keras

    wrappers = (keras.optimizers.LossScaleOptimizer, keras.optimizers.MultiOptimizer)
    keras_optimizers = {name for name, cls in vars(keras.optimizers).items()
                        if isinstance(cls, type) and issubclass(cls, keras.optimizers.Optimizer)
                        and cls is not keras.optimizers.Optimizer and cls not in wrappers}
    assert {o.keras_class for o in config.OPTIMIZERS.values()} == keras_optimizers
    for name, optimizer in config.OPTIMIZERS.items():
        assert name == optimizer.keras_class.lower()


@pytest.mark.parametrize("name", config.OPTIMIZERS)
def test_every_optimizer_builds_from_the_defaults(name):
    import keras

    from hvdtrain.run import compiled_model

    optimizer = compiled_model.keras_optimizer(TrainConfig(optimizer=name).validate(), 0.5)
    assert isinstance(optimizer, getattr(keras.optimizers, config.OPTIMIZERS[name].keras_class))
    assert float(optimizer.learning_rate) == 0.5
    assert not optimizer.use_ema and optimizer.clipnorm is None
    for argument, value in config.OPTIMIZERS[name].arguments(TrainConfig()).items():
        assert getattr(optimizer, argument) == pytest.approx(value)


def test_the_knobs_every_keras_optimizer_takes_reach_it():
    from hvdtrain.run import compiled_model

    for knobs in (dict(clipnorm=2.0), dict(global_clipnorm=3.0), dict(clipvalue=0.5)):
        optimizer = compiled_model.keras_optimizer(
            TrainConfig(optimizer="lion", weight_decay=0.01, ema_momentum=0.9, **knobs)
            .validate(), 0.1)
        ((name, value),) = knobs.items()
        assert getattr(optimizer, name) == value
        assert (optimizer.weight_decay, optimizer.use_ema, optimizer.ema_momentum) == (
            0.01, True, 0.9)
    sgd = compiled_model.keras_optimizer(TrainConfig(nesterov=True, momentum=0.8), 0.1)
    assert sgd.nesterov and sgd.momentum == pytest.approx(0.8)
    # Unset, the optimizer's own default weight decay stands.
    assert compiled_model.keras_optimizer(TrainConfig(optimizer="adamw"), 0.1).weight_decay \
        == pytest.approx(0.004)
