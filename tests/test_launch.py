"""The one launcher of aiayn.plan and aiayn.variations: runs in order, a few at a time, each with its log."""

import pytest

from aiayn.runs import launch


def test_runs_each_job_with_its_log_and_calls_back_with_its_exit_code(tmp_path, capsys):
    seen = []
    jobs = [
        launch.Job(
            name,
            ["--direction", "xx"],
            tmp_path / f"{name}.log",
            lambda n=name: seen.append(("before", n)),
            lambda code, n=name: seen.append(("after", n, code)),
        )
        for name in ("a", "b", "c")
    ]
    codes = launch.run_all(jobs, parallel=2)
    assert codes == {"a": 2, "b": 2, "c": 2}  # argparse refuses --direction xx
    assert [e[1] for e in seen if e[0] == "before"] == ["a", "b", "c"]  # started in order
    assert sorted(e[1:] for e in seen if e[0] == "after") == [("a", 2), ("b", 2), ("c", 2)]
    assert "invalid choice: 'xx'" in (tmp_path / "a.log").read_text()
    assert capsys.readouterr().out.count("FAILED in") == 3


def test_a_hung_run_is_killed_after_the_timeout(tmp_path):
    # the experiment's own start (imports) takes longer than this timeout, so the launcher kills it
    codes = launch.run_all([launch.Job("slow", ["--help"], tmp_path / "slow.log")], parallel=1, timeout=0.01)
    assert codes == {"slow": None}


def test_parallel_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="at least 1"):
        launch.run_all([], parallel=0)
