"""Preemption in one process: the signals named, the handlers' lifetime, a
real signal asking to stop, and PreemptionStop ending fit after the step
the vote (in the optimizer's step) agreed on, with its checkpoint."""

import os
import signal

import keras
import numpy as np
import pytest

import hvdtrain
from hvdtrain import callbacks
from hvdtrain.config import TrainConfig
from hvdtrain.errors import UsageError
from hvdtrain.faults import preemption
from hvdtrain.parallel.data_parallel import optimizer
from hvdtrain.state import checkpoint


@pytest.fixture(scope="module", autouse=True)
def horovod():
    hvdtrain.init()


@pytest.fixture(autouse=True)
def handlers():
    yield
    preemption.uninstall()


def test_signals_are_named_as_the_shell_names_them():
    assert preemption.parse_signals("SIGTERM,usr1, SIGINT,TERM") == (
        signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
    assert preemption.parse_signals("") == ()


@pytest.mark.parametrize("text,problem", [("SIGTERM,SIGFOO", "unknown signal SIGFOO"),
                                          ("KILL", "SIGKILL cannot be caught"),
                                          ("SIGSTOP", "SIGSTOP cannot be caught")])
def test_a_bad_signal_name_is_a_usage_error_naming_it(text, problem):
    with pytest.raises(UsageError, match=problem):
        preemption.parse_signals(text)
    with pytest.raises(UsageError, match=problem):
        TrainConfig(preemption_signals=text).validate()


def test_a_signal_asks_to_stop_once_and_the_handlers_are_given_back(capfd):
    before = signal.getsignal(signal.SIGUSR1)
    preemption.install((signal.SIGUSR1, signal.SIGUSR2))
    assert preemption.handling() and preemption.requested() is None
    os.kill(os.getpid(), signal.SIGUSR1)
    os.kill(os.getpid(), signal.SIGUSR2)
    assert preemption.requested() == "SIGUSR1"   # the first reason is kept
    err = capfd.readouterr().err
    assert "hvdtrain: SIGUSR1: stopping after the step under way" in err
    assert "hvdtrain: SIGUSR2: already stopping (SIGUSR1)" in err
    preemption.uninstall()
    assert not preemption.handling() and signal.getsignal(signal.SIGUSR1) == before


def test_a_signal_ignored_when_the_run_starts_stays_ignored():
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)   # as a background job has SIGINT
    try:
        preemption.install((signal.SIGUSR1, signal.SIGUSR2))
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGUSR1) == preemption._on_signal
    finally:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)


def test_after_a_stop_the_signals_are_ignored_until_the_process_exits():
    preemption.install((signal.SIGUSR1,))
    preemption.ignore_further()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGUSR1)   # would end the process by default
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def _fit_asking_to_stop(tmp_path, ask_at, epochs=3, steps=5):
    """Fits 2 x `steps` batches a request arrives during batch `ask_at`
    ((epoch, batch)); returns the Preempted raised (None: fit ended) and
    the saver."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvdtrain.DistributedOptimizer(keras.optimizers.SGD(0.1)),
                  loss="mse")
    vote = callbacks.StopVote()
    optimizer.add_step_exchange(model.optimizer, vote.exchange)
    saver = callbacks.PeriodicCheckpoint(tmp_path, {}, batch_size=2, epochs=epochs)
    stop = callbacks.PreemptionStop(vote, saver, batch_size=2, epochs=epochs, start=(0, 0))

    class Ask(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if (self.epoch, batch) == ask_at:
                preemption.request("SIGTERM")

    preemption.install(())
    x = np.ones((2 * steps, 2), "float32")
    try:
        model.fit(x, x[:, :1], batch_size=2, epochs=epochs, verbose=0,
                  callbacks=callbacks.in_order([saver, stop]) + [Ask()])
    except preemption.Preempted as e:
        return e, saver
    return None, saver


def test_a_request_during_a_step_stops_after_the_next_with_its_checkpoint(tmp_path):
    # Asked after the vote of epoch 2's batch 1 was cast: batch 2 carries it.
    stopped, saver = _fit_asking_to_stop(tmp_path, ask_at=(1, 1))
    assert stopped is not None and stopped.reason == "SIGTERM"
    assert (stopped.position.epoch, stopped.position.step) == (1, 3)
    newest, _ = checkpoint.read(checkpoint.listed(tmp_path)[0])
    assert newest.position == stopped.position
    assert "after epoch 2, step 3 of 5" in str(stopped)


def test_a_stop_agreed_at_an_epochs_last_step_waits_for_that_epochs_end(tmp_path):
    stopped, saver = _fit_asking_to_stop(tmp_path, ask_at=(0, 3))
    assert (stopped.position.epoch, stopped.position.step) == (1, 0)
    # The epoch's own checkpoint is the preemption's: not written twice.
    assert [p.name for p in checkpoint.listed(tmp_path)] == ["epoch-0001-step-000005"]


def test_a_request_in_the_last_epochs_last_step_lets_the_run_end(tmp_path):
    stopped, saver = _fit_asking_to_stop(tmp_path, ask_at=(2, 3))
    assert stopped is None
    assert saver.last_written == (3, 0)
