"""How `rollcap bench` prints a wall-clock figure: its range over rounds, "within noise" for a cost whose range holds
zero (never "-0.0%"), one round said to have no range, the machine's load beside a figure measured while it was busy,
and the sections' seconds last."""

from __future__ import annotations

from rollcap.rollout.bench.report import _FORMAT, format_report
from rollcap.rollout.bench.timing import cost_text, load_note, ratio_text, spread

BUSY, IDLE = {"load": 8.6, "cpus": 2}, {"load": 0.3, "cpus": 2}


def test_a_cost_says_its_range_and_never_minus_zero():
    """A thread writer that cost -0.0% (median -0.0004) is within noise, with the range it came from."""
    assert cost_text(spread([-0.0004, 0.002, -0.003])) == "within noise (-0.3% to 0.2% over 3 rounds)"
    assert cost_text(spread([0.12, 0.10, 0.14])) == "12.0% (10.0% to 14.0% over 3 rounds)"
    assert cost_text(spread([0.542])) == "54.2% (1 round: no spread)"
    assert "-0.0%" not in cost_text(spread([-0.00001, -0.00002]))


def test_a_figure_from_a_busy_machine_carries_the_load():
    """Above half the cores busy, a ratio and a cost name the load they ran under; an idle machine adds nothing."""
    assert ratio_text(spread([0.68, 0.70]), BUSY) == "0.69x (0.68-0.70 over 2 rounds; noisy: load 8.6 on 2 cpus)"
    assert ratio_text(spread([1.10, 1.12, 1.08]), IDLE) == "1.10x (1.08-1.12 over 3 rounds)"
    assert cost_text(spread([0.3, 0.4, 0.5]), BUSY).endswith("over 3 rounds; noisy: load 8.6 on 2 cpus)")
    assert load_note(None) == load_note(IDLE) == ""


def test_the_seconds_per_section_come_last_with_the_run_s_wall_and_load():
    """The seconds line is printed after every section (it came before branch), with the whole run and its load; a
    section that ran on a busy machine says so in its title."""
    assert list(_FORMAT)[-1] == "section_s"
    report = {
        "machine": {
            "platform": "p",
            "cpus": 2,
            "torch": "t",
            "device": "cpu",
            "cpu_capability": "c",
            "threads_per_lane": 1,
        },
        "env": {"env_id": "rollcap/PushBlock-v0", "steps": 200},
        "section_s": {"env": 0.2},
        "load": {"env": BUSY},
        "wall_s": 71.0,
    }
    text = format_report(report).splitlines()
    assert "env: [noisy: load 8.6 on 2 cpus]" in text  # the section's title says it ran on a busy machine
    last = text[-1]
    assert last == (
        "seconds per section: env 0.2; 71 s in all at a 1-minute load of 8.6 to 8.6 on 2 cpus "
        "(busy: wall-clock figures marked noisy)"
    )
