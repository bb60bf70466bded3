"""python -m raggeddot times raggeddot and the NumPy loop in interleaved
rounds, as the benchmarks do, and warns when the machine is loaded (item 11)."""
import os

import pytest

import raggeddot.__main__ as main_module
from raggeddot import _timing, specs


def _first_main_spec():
    return next(s for s in specs.select(tags=["main"]) if s.op in main_module.MAIN_OPS).name


def test_variants_are_timed_in_interleaved_rounds(monkeypatch, capsys):
    calls = []
    real = _timing.interleaved

    def spy(fns, **kw):
        calls.append(sorted(fns))
        return real(fns, **kw)

    monkeypatch.setattr(_timing, "interleaved", spy)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert main_module.main(["--scale", "0.02", "--budget", "0", "--spec", _first_main_spec()]) == 0
    assert calls and all(c == ["loop", "raggeddot"] for c in calls)
    assert "warning" not in capsys.readouterr().out


@pytest.mark.parametrize("load, warned", [(0.4, False), (0.6, True)])
def test_a_loaded_machine_is_named(monkeypatch, capsys, load, warned):
    cores = os.cpu_count()
    monkeypatch.setattr(os, "getloadavg", lambda: (load * cores, 0.0, 0.0))
    assert main_module.main(["--scale", "0.02", "--budget", "0", "--spec", _first_main_spec()]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("warning: the machine is loaded")]
    assert len(lines) == (1 if warned else 0), out
    if warned:
        assert f"{cores} cores" in lines[0] and "'vs loop'" in lines[0]
