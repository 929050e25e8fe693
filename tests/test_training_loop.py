"""The trainer's loop: the learning-rate schedule, the steps' precision, and a run under both."""

import pytest

torch = pytest.importorskip("torch")

from specdesk.app.training import precision  # noqa: E402
from specdesk.app.training.loop import LoopSettings, learning_rate, train_loop  # noqa: E402


def test_the_rate_warms_up_holds_and_falls_to_zero_over_the_last_share_of_the_steps():
    settings = LoopSettings(minutes=1000, max_steps=100, peak_lr=1e-3, warmup_steps=10, cooldown=0.2)
    rates = [learning_rate(settings, step, elapsed=0.0) for step in range(100)]
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3)
    assert all(r == pytest.approx(1e-3) for r in rates[9:81])
    assert rates[90] == pytest.approx(0.5e-3) and rates[99] == pytest.approx(0.05e-3)
    assert all(a >= b for a, b in zip(rates[80:], rates[81:]))


def test_a_time_budget_cools_down_by_the_time_spent():
    settings = LoopSettings(minutes=10, peak_lr=1e-3, warmup_steps=1, cooldown=0.25)
    assert learning_rate(settings, 500, elapsed=0.5 * 600) == pytest.approx(1e-3)
    assert learning_rate(settings, 500, elapsed=0.875 * 600) == pytest.approx(0.5e-3)
    assert learning_rate(settings, 500, elapsed=600.0) == 0.0
    # whichever budget runs out first: here the steps
    both = LoopSettings(minutes=10, max_steps=1000, peak_lr=1e-3, warmup_steps=1, cooldown=0.25)
    assert learning_rate(both, 875, elapsed=60.0) == pytest.approx(0.5e-3)


def test_without_a_cooldown_the_rate_stays_at_its_peak():
    settings = LoopSettings(minutes=1, max_steps=10, peak_lr=2e-3, warmup_steps=1)
    assert {learning_rate(settings, step, elapsed=59.0) for step in range(10)} == {2e-3}


def test_precision_choices(monkeypatch):
    assert precision.choose_precision("cpu", "float32") is None
    assert precision.choose_precision("cpu", "bfloat16") is torch.bfloat16
    assert precision.choose_precision("mps", "auto") is None
    with pytest.raises(ValueError, match="unknown precision 'half'"):
        precision.choose_precision("cpu", "half")
    # auto on a CPU: bfloat16 only where its products are at least twice as fast, as timed here
    monkeypatch.setattr(precision, "_product_gain", lambda device: 1.3)
    assert precision.choose_precision("cpu", "auto") is None
    monkeypatch.setattr(precision, "_product_gain", lambda device: 6.0)
    assert precision.choose_precision("cpu", "auto") is torch.bfloat16
    assert precision.precision_name(None) == "float32"
    assert precision.precision_name(torch.bfloat16) == "bfloat16 autocast"


def test_the_timing_is_real_and_taken_once_per_thread_count():
    precision._timed.clear()
    gain = precision._product_gain("cpu")
    assert gain > 0 and list(precision._timed) == [("cpu", torch.get_num_threads())]
    assert precision._product_gain("cpu") == gain


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_a_run_learns_and_keeps_float32_weights_in_either_precision(dtype, tmp_path):
    """A small regression trained in the loop: its forward under autocast, its weights, gradients
    and optimizer in float32; the loss falls and the best state is kept."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.SiLU(), torch.nn.Linear(128, 64))
    teacher = torch.nn.Linear(64, 64)
    inputs = torch.randn(256, 64)
    with torch.no_grad():
        wanted = teacher(inputs)
    seen = []

    def step(rng):
        rows = torch.from_numpy(rng.choice(256, size=64, replace=False))
        out = model(inputs[rows])
        seen.append(out.dtype)
        return torch.nn.functional.mse_loss(out.float(), wanted[rows]), {}

    def evaluate():
        loss = float(torch.nn.functional.mse_loss(model(inputs).float(), wanted))
        return -loss, {"acceptance": [round(-loss, 4)]}

    settings = LoopSettings(minutes=10, max_steps=60, peak_lr=1e-2, warmup_steps=5, eval_every=20, cooldown=0.2,
                            precision=dtype)
    state = train_loop(model, step, evaluate, settings, tmp_path, resume=False, report=lambda line: None)
    assert state.step == 60
    assert set(seen) == {dtype or torch.float32}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    scores = [h["acceptance"][0] for h in state.history]
    assert scores[-1] > 0.5 * scores[0]  # losses are negative scores: the last is less than half the first
    assert state.best_step == max(state.history, key=lambda h: h["acceptance"][0])["step"]
