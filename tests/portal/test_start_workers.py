"""The launcher: machine facts in, worker command lines out."""

import subprocess
import sys
from io import StringIO

from django.core.management import call_command

from portal.management.workers import MachineFacts, arch_from_compute_cap, worker_commands


def test_a_machine_without_a_gpu_runs_one_cpu_worker_for_agents_build_and_default():
    commands = worker_commands(MachineFacts(cpu_count=2, gpu_ids=(), hostname="h"))
    assert [c.name for c in commands] == ["cpu@h"]
    argv = commands[0].argv
    assert argv[argv.index("-Q") + 1] == "agents,build,default"
    assert "CUDA_VISIBLE_DEVICES" not in commands[0].env


def test_each_gpu_gets_one_single_child_prefork_worker_pinned_to_it():
    facts = MachineFacts(cpu_count=16, gpu_ids=("0", "1", "2"), gpu_arch="sm_90", hostname="h")
    gpu_workers = [c for c in worker_commands(facts) if c.name.startswith("gpu")]
    assert [c.env["CUDA_VISIBLE_DEVICES"] for c in gpu_workers] == ["0", "1", "2"]
    for command in gpu_workers:
        argv = command.argv
        assert argv[argv.index("-Q") + 1] == "gpu.sm_90"
        assert argv[argv.index("-P") + 1] == "prefork"  # time limits need prefork
        assert argv[argv.index("-c") + 1] == "1"
    assert len({c.name for c in gpu_workers}) == 3


def test_blackwell_gpus_consume_their_own_queue():
    facts = MachineFacts(cpu_count=4, gpu_ids=("0",), gpu_arch="sm_100", hostname="h")
    argv = worker_commands(facts)[1].argv
    assert argv[argv.index("-Q") + 1] == "gpu.sm_100"


def test_a_gpu_only_host_runs_no_cpu_worker():
    facts = MachineFacts(cpu_count=4, gpu_ids=("0",), hostname="h")
    assert [c.name for c in worker_commands(facts, cpu_queues=())] == ["gpu0@h"]


def test_compute_capability_names_the_architecture():
    assert arch_from_compute_cap("9.0") == "sm_90"
    assert arch_from_compute_cap("10.0") == "sm_100"


def test_start_workers_with_fake_gpus_plans_one_worker_per_gpu():
    out = StringIO()
    call_command("start_workers", "--dry-run", "--fake-gpus", "2", stdout=out)
    lines = out.getvalue().splitlines()
    assert sum("CUDA_VISIBLE_DEVICES=" in line for line in lines) == 2
    assert any("-Q agents,build,default" in line for line in lines)


def test_probing_for_gpus_does_not_load_cuda_in_the_parent():
    code = (
        "import sys\n"
        "from portal.management.workers import machine_facts\n"
        "machine_facts()\n"
        "print(any(m == 'cuda' or m.startswith('cuda.') for m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
