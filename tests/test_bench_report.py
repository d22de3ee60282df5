"""The main benchmark report's own logic (no Spark): the machine banner and whether the proof was fed."""

from benchmarks.report import _fed, machine_banner


def results(load: float, others: list[float | None]) -> dict:
    return {"machine": {"cores": 2}, "load_average_start": [load, 1.0, 1.0], "load_average_end": [load, 1.0, 1.0],
            "cases": [{"cpu_share": {"others_average_cores": o}} for o in others]}


def test_a_high_load_average_with_no_measured_use_is_called_quiet():
    [line, _] = machine_banner(results(1.4, [0.0, 0.02]))
    assert line.startswith("> Load average 1.4") and "was quiet" in line and "shared" not in line


def test_measured_use_by_other_processes_is_called_shared():
    [line, _] = machine_banner(results(0.2, [0.0, 0.4]))
    assert line.startswith("> The machine was shared") and "0.40" in line
    [line, _] = machine_banner(results(1.4, [0.0, None]))  # unmeasured: the load average decides
    assert line.startswith("> The machine was shared")


def test_a_quiet_machine_gets_no_banner():
    assert machine_banner(results(0.3, [0.0, 0.0])) == []


def test_the_proof_counts_as_fed_only_when_every_run_says_so():
    def case(*fed):
        return {"runs": {"new_proof": [{"read_before": {"fed_by_rewrite": f}} for f in fed]}}

    assert _fed(case(True, True, True))
    assert not _fed(case(True, False, True))
    assert not _fed({"runs": {"new_proof": []}}) and not _fed({})
