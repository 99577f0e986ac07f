"""The multi-card script's plan before any rank starts: the rank count from the cards
and the environment, hosts and hostfiles, HOROVOD_RUN_ARGS, and DRY_RUN=1's plan."""

import os
import re
import subprocess

import pytest

from bert_pretrain.distributed import launch as launch_plan
from conftest import (INSTALLED_PATH, ROOT, launcher_env, passing_ranks_path,
                      run_multi_card_script)


@pytest.mark.parametrize("values,ranks,message", [
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "4"}, "4", ""),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2"}, "3", ""),
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "2", "CUDA_VISIBLE_DEVICES": "0,1"}, "2", ""),
    ({"CUDA_VISIBLE_DEVICES": "GPU-8f6e2a1c-0d3b-4c5e-9a7f-112233445566,MIG-GPU-ab12/1/0"},
     "2", ""),
    ({}, "2", "2 CPU ranks"),
    ({"CUDA_VISIBLE_DEVICES": ""}, "2", "CUDA_VISIBLE_DEVICES is empty (or -1), which hides "
     "every card: 2 CPU ranks per host"),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, "2", "CUDA_VISIBLE_DEVICES is empty (or -1), which hides "
     "every card: 2 CPU ranks per host"),
    ({"listed": "nvidia-smi"}, "3", "one rank per card that nvidia-smi -L lists on this host"),
    ({"listed": "ixsmi"}, "3", "one rank per card that ixsmi -L lists on this host"),
    ({"listed": "nvidia-smi", "CUDA_VISIBLE_DEVICES": ""}, "2", "CUDA_VISIBLE_DEVICES is "
     "empty"),
])
def test_rank_count_from_the_environment(values, ranks, message, tmp_path):
  """listed: a fake nvidia-smi or Iluvatar's ixsmi on PATH listing 3 GPUs."""
  values = dict(values)
  path = "/usr/bin:/bin"
  lister = values.pop("listed", None)
  if lister:
    smi = tmp_path / lister
    smi.write_text("#!/bin/sh\nfor i in 0 1 2; do echo \"GPU $i: BI-V100 (UUID: GPU-$i)\"; "
                   "done\n")
    smi.chmod(0o755)
    path = "%s:%s" % (tmp_path, path)
  result = subprocess.run(["bash", "-c", 'here=.; source scripts/common.sh; count_ranks'],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=launcher_env(PATH=path, **values))
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == ranks
  # Cards named explicitly: the count is what was asked for, with no note.
  assert (message in result.stderr) if message else result.stderr == ""


@pytest.mark.parametrize("values,message", [
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "8", "CUDA_VISIBLE_DEVICES": "0,1"},
     "IX_NUM_CUDA_VISIBLE_DEVICES=8 but CUDA_VISIBLE_DEVICES=0,1 lists 2 cards"),
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "eight"},
     "IX_NUM_CUDA_VISIBLE_DEVICES=eight is not a positive number"),
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "99999999999999999999"},
     "99999999999999999999 ranks a host (IX_NUM_CUDA_VISIBLE_DEVICES, else the cards listed) "
     "is more than a host runs (at most 1024); export the number of cards, or of CPU ranks, "
     "e.g. IX_NUM_CUDA_VISIBLE_DEVICES=8"),
    ({"CUDA_VISIBLE_DEVICES": "0,1,-1"}, "CUDA_VISIBLE_DEVICES=0,1,-1: -1 hides the cards from "
     "there on; export only the cards to use, or unset it for CPU ranks "
     "(IX_NUM_CUDA_VISIBLE_DEVICES=N chooses how many)"),
    ({"CUDA_VISIBLE_DEVICES": "-1,0"}, "CUDA_VISIBLE_DEVICES=-1,0: -1 hides the cards from "
     "there on"),
    ({"CUDA_VISIBLE_DEVICES": ","}, "CUDA_VISIBLE_DEVICES=, lists no card"),
    ({"CUDA_VISIBLE_DEVICES": "0,abc"}, "CUDA_VISIBLE_DEVICES=0,abc: 'abc' is not a card (its "
     "index or its GPU-/MIG- UUID); export the cards to use, e.g. CUDA_VISIBLE_DEVICES=0,1"),
    ({"CUDA_VISIBLE_DEVICES": "0,1,0"}, "CUDA_VISIBLE_DEVICES=0,1,0 lists card 0 twice; each "
     "rank needs a card of its own"),
    ({"CUDA_VISIBLE_DEVICES": "1,0,1,0"}, "CUDA_VISIBLE_DEVICES=1,0,1,0 lists card 0 twice; "
     "each rank"),
])
def test_launcher_rejects_inconsistent_card_counts(values, message, tmp_path):
  result = run_multi_card_script(tmp_path, **values)
  assert result.returncode == 2
  assert "run_multi_card_FPS: error: " + message in result.stderr
  assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("run_args,ranks,hosts,args", [
    (["--gloo"], 8, ["localhost"], ["-np", "8", "-H", "localhost:8", "--gloo"]),
    (["--mpi"], 8, ["localhost"], ["-np", "8", "-H", "localhost:8", "--mpi"]),
    (["--gloo", "-H", "h1:8,h2:8"], 16, ["h1", "h2"], ["-np", "16", "-H", "h1:8,h2:8", "--gloo"]),
    (["--gloo", "-H", "h1,h2,h3"], 24, ["h1", "h2", "h3"],
     ["-np", "24", "-H", "h1:8,h2:8,h3:8", "--gloo"]),
    (["--hosts=h1,10.0.0.2:8", "--mpi", "--network-interface", "eth0"], 16, ["h1", "10.0.0.2"],
     ["-np", "16", "-H", "h1:8,10.0.0.2:8", "--mpi", "--network-interface", "eth0"]),
    (["-np", "16", "-H", "h1:8,h2:8"], 16, ["h1", "h2"], ["-np", "16", "-H", "h1:8,h2:8"]),
], ids=["one-host", "mpi", "slots", "no-slots", "hosts=", "np-agrees"])
def test_the_plan_gives_horovodrun_the_total_and_every_host(run_args, ranks, hosts, args):
  job = launch_plan.plan(run_args, per_host=8)
  assert (job.ranks, job.hosts, job.per_host, job.args) == (ranks, hosts, 8, args)
  assert launch_plan.summary(job) == "Launching %d ranks on %d host%s (8 per host)" % (
      ranks, len(hosts), "s" if len(hosts) > 1 else "")


@pytest.mark.parametrize("form", ["--hostfile", "--hostfile=", "-hostfile", "--hostf"])
def test_a_hostfile_becomes_the_host_list(form, tmp_path):
  hostfile = tmp_path / "hosts"
  hostfile.write_text("# the cluster\nnode1 slots=4\n\nnode2   # no slots: the count per host\n")
  run_args = [form + str(hostfile)] if form.endswith("=") else [form, str(hostfile)]
  job = launch_plan.plan(["--mpi"] + run_args, per_host=4)
  assert job.args == ["-np", "8", "-H", "node1:4,node2:4", "--mpi"]
  assert job.hosts == ["node1", "node2"]


@pytest.mark.parametrize("run_args,hostfile,message", [
    (["-H", "h1:8,h2:4"], None, "host h2 has 4 slots in -H h1:8,h2:4 but the count per host "
     "is 8 (IX_NUM_CUDA_VISIBLE_DEVICES, else the entries of CUDA_VISIBLE_DEVICES); export "
     "IX_NUM_CUDA_VISIBLE_DEVICES=4 or give h2:8"),
    (["--hostfile", "{hosts}"], "h1 slots=2\n", "host h1 has 2 slots in the hostfile"),
    (["--hostfile", "{hosts}"], "h1 slots=2\n", "export IX_NUM_CUDA_VISIBLE_DEVICES=2 or give "
     "h1 slots=8"),
    (["--hostfile", "{hosts}"], "# nothing\n\n", "lists no host"),
    (["--hostfile", "{hosts}"], "h1 cpus=8\n", "bad line 'h1 cpus=8'"),
    (["--hostfile", "{missing}"], None, "cannot read the hostfile"),
    (["-H", "h1:8,,h2"], None, "bad host ''"),
    (["-H", "h1:0"], None, "bad host 'h1:0'"),
    (["-H", "h1:x"], None, "bad host 'h1:x'"),
    (["-H", "h1,h1"], None, "host h1 is listed twice"),
    (["-H", "h1", "--hostfile", "{hosts}"], "h2\n", "gives the hosts or -np twice"),
    (["-np", "8", "-H", "h1,h2"], None, "-np 8 in HOROVOD_RUN_ARGS but 2 hosts x 8 per host = 16"),
    (["-H"], None, "-H in HOROVOD_RUN_ARGS has no value"),
    (["--num-pro", "4"], None, "-np 4 in HOROVOD_RUN_ARGS but 1 host x 8 per host = 8"),
    (["--num-proc=16", "-H", "h1"], None, "-np 16 in HOROVOD_RUN_ARGS but 1 host x 8"),
])
def test_the_plan_rejects_contradictions(run_args, hostfile, message, tmp_path):
  if hostfile is not None:
    (tmp_path / "hosts").write_text(hostfile)
  run_args = [a.format(hosts=tmp_path / "hosts", missing=tmp_path / "missing") for a in run_args]
  with pytest.raises(launch_plan.LaunchError, match=re.escape(message)):
    launch_plan.plan(["--gloo"] + run_args, per_host=8)


@pytest.mark.parametrize("per_host,gpus,cores,message", [
    (8, 8, 2, None),
    (2, 0, 2, None),
    (9, 8, 64, "9 cards asked for (IX_NUM_CUDA_VISIBLE_DEVICES) but ixsmi lists 8 on "
     "this host; export IX_NUM_CUDA_VISIBLE_DEVICES=8 or fewer"),
    (3, 0, 2, "3 CPU ranks asked for (IX_NUM_CUDA_VISIBLE_DEVICES) on a host of 2 cores where "
     "neither nvidia-smi nor ixsmi lists a GPU: each would get less than a core; export "
     "IX_NUM_CUDA_VISIBLE_DEVICES=2 or fewer, or name the host to oversubscribe anyway: "
     "HOROVOD_RUN_ARGS=\"--gloo -H localhost:3\""),
])
def test_a_job_on_this_host_alone_asks_for_no_more_cards_than_it_has(per_host, gpus, cores,
                                                                    message):
  cards = launch_plan.Cards(gpus, "ixsmi" if gpus else None)
  if message is None:
    launch_plan.check_this_host(per_host, cards, cores)
  else:
    with pytest.raises(launch_plan.LaunchError) as error:
      launch_plan.check_this_host(per_host, cards, cores)
    assert str(error.value) == message


def test_a_card_list_on_a_host_without_gpus_asks_for_no_more_cpu_ranks_than_cores():
  """The count from CUDA_VISIBLE_DEVICES's entries (--device=cpu would run them on the CPU)
  meets the limit IX_NUM_CUDA_VISIBLE_DEVICES's does; the error names the list."""
  none = launch_plan.Cards(0, None)
  launch_plan.check_this_host(2, none, 2, visible="0,1")
  with pytest.raises(launch_plan.LaunchError) as error:
    launch_plan.check_this_host(3, none, 2, visible="0,1,2")
  assert str(error.value) == (
      "3 CPU ranks asked for (CUDA_VISIBLE_DEVICES=0,1,2) on a host of 2 cores where neither "
      "nvidia-smi nor ixsmi lists a GPU: each would get less than a core; unset "
      "CUDA_VISIBLE_DEVICES and export IX_NUM_CUDA_VISIBLE_DEVICES=2 or fewer, or name the "
      "host to oversubscribe anyway: "
      "HOROVOD_RUN_ARGS=\"--gloo -H localhost:3\"")
  with pytest.raises(launch_plan.LaunchError) as error:
    launch_plan.check_this_host(3, launch_plan.Cards(2, "nvidia-smi"), 64,
                                visible="GPU-a,GPU-b,GPU-c")
  assert str(error.value) == (
      "3 cards asked for (CUDA_VISIBLE_DEVICES=GPU-a,GPU-b,GPU-c) but nvidia-smi lists 2 on "
      "this host; export a CUDA_VISIBLE_DEVICES of 2 cards or fewer")


@pytest.mark.parametrize("gpus,message", [
    (4, "4 CPU ranks asked for (IX_NUM_CUDA_VISIBLE_DEVICES) on a host of 2 cores: "
     "CUDA_VISIBLE_DEVICES is empty (or -1), which hides the 4 cards ixsmi lists; unset "
     "CUDA_VISIBLE_DEVICES to train on them, or export IX_NUM_CUDA_VISIBLE_DEVICES=2 or fewer"),
    (0, "4 CPU ranks asked for (IX_NUM_CUDA_VISIBLE_DEVICES) on a host of 2 cores where "
     "neither nvidia-smi nor ixsmi lists a GPU: each would get less than a core; export "
     "IX_NUM_CUDA_VISIBLE_DEVICES=2 or fewer, or name the host to oversubscribe anyway: "
     "HOROVOD_RUN_ARGS=\"--gloo -H localhost:4\""),
])
def test_cards_an_empty_cuda_visible_devices_hides_are_named_when_too_many_cpu_ranks_are_asked_for(
    gpus, message):
  cards = launch_plan.Cards(gpus, "ixsmi" if gpus else None)
  launch_plan.check_this_host(2, cards, 2, hidden=True)
  launch_plan.check_this_host(4, cards, 4, hidden=True)  # as many as cores; more than cards
  with pytest.raises(launch_plan.LaunchError) as error:
    launch_plan.check_this_host(4, cards, 2, hidden=True)
  assert str(error.value) == message


def test_the_script_counts_this_hosts_cards_unless_the_hosts_are_named(tmp_path):
  bin_dir = tmp_path / "gpu_bin"
  bin_dir.mkdir()
  smi = bin_dir / "nvidia-smi"
  smi.write_text("#!/bin/sh\necho 'GPU 0: A100 (UUID: GPU-0)'\necho 'GPU 1: A100 (UUID: GPU-1)'\n")
  smi.chmod(0o755)
  # The ranks' check of their inputs (DRY_RUN=1) passes: /data is not here.
  installed = passing_ranks_path(tmp_path, INSTALLED_PATH)
  cores = os.cpu_count()
  too_many = run_multi_card_script(tmp_path, "--input_files_dir=/data", DRY_RUN="1",
                                   IX_NUM_CUDA_VISIBLE_DEVICES=str(cores + 1), PATH=installed)
  assert too_many.returncode == 2 and too_many.stdout == ""
  assert too_many.stderr.strip() == (
      "run_multi_card_FPS: error: %d CPU ranks asked for (IX_NUM_CUDA_VISIBLE_DEVICES) on a "
      "host of %d cores where neither nvidia-smi nor ixsmi lists a GPU: each would get less "
      "than a core; export IX_NUM_CUDA_VISIBLE_DEVICES=%d or fewer, or name the host to "
      "oversubscribe anyway: "
      "HOROVOD_RUN_ARGS=\"--gloo -H localhost:%d\"" % (cores + 1, cores, cores, cores + 1))
  listed = ",".join(str(card) for card in range(cores + 1))
  too_many_listed = run_multi_card_script(tmp_path, "--input_files_dir=/data", "--device=cpu",
                                          DRY_RUN="1", CUDA_VISIBLE_DEVICES=listed, PATH=installed)
  assert too_many_listed.returncode == 2 and too_many_listed.stdout == ""
  assert too_many_listed.stderr.strip().startswith(
      "run_multi_card_FPS: error: %d CPU ranks asked for (CUDA_VISIBLE_DEVICES=%s) on a host "
      "of %d cores where neither nvidia-smi nor ixsmi lists a GPU" % (cores + 1, listed, cores))
  named = run_multi_card_script(tmp_path, "--input_files_dir=/data", DRY_RUN="1",
                                IX_NUM_CUDA_VISIBLE_DEVICES=str(cores + 1), PATH=installed,
                                HOROVOD_RUN_ARGS="--gloo -H localhost:%d" % (cores + 1))
  assert named.returncode == 0, named.stderr
  assert named.stdout.startswith("Launching %d ranks on 1 host" % (cores + 1))
  gpu_path = "%s:%s" % (bin_dir, installed)
  three = run_multi_card_script(tmp_path, "--input_files_dir=/data", DRY_RUN="1",
                                IX_NUM_CUDA_VISIBLE_DEVICES="3", PATH=gpu_path)
  assert three.returncode == 2
  assert three.stderr.strip() == (
      "run_multi_card_FPS: error: 3 cards asked for (IX_NUM_CUDA_VISIBLE_DEVICES) but "
      "nvidia-smi lists 2 on this host; export IX_NUM_CUDA_VISIBLE_DEVICES=2 or fewer")
  for no_card in ("", "-1"):
    hidden = run_multi_card_script(tmp_path, "--input_files_dir=/data", DRY_RUN="1",
                                   PATH=gpu_path, CUDA_VISIBLE_DEVICES=no_card,
                                   IX_NUM_CUDA_VISIBLE_DEVICES=str(cores + 1))
    assert hidden.returncode == 2
    assert ("CUDA_VISIBLE_DEVICES is empty (or -1), which hides the 2 cards nvidia-smi lists; "
            "unset CUDA_VISIBLE_DEVICES to train on them"
            in hidden.stderr.strip().splitlines()[-1]), no_card
  two = run_multi_card_script(tmp_path, "--input_files_dir=/data", DRY_RUN="1", PATH=gpu_path)
  assert two.returncode == 0, two.stderr
  assert two.stdout.startswith("Launching 2 ranks on 1 host (2 per host)")
  # A card list names cards this host has (CUDA would hide those after a missing one, and
  # ranks would share the rest); the script's default of 2 CPU ranks stands on any host.
  for values in (dict(CUDA_VISIBLE_DEVICES="1,0", PATH=gpu_path), dict(PATH=installed),
                 dict(CUDA_VISIBLE_DEVICES="GPU-1,GPU-0", PATH=gpu_path)):
    listed = run_multi_card_script(tmp_path, "--input_files_dir=/data", DRY_RUN="1", **values)
    assert listed.returncode == 0, listed.stderr
  for visible, card in (("0,1,2", 2), ("0,5", 5)):
    missing = run_multi_card_script(tmp_path, "--input_files_dir=/data", DRY_RUN="1", PATH=gpu_path,
                                    CUDA_VISIBLE_DEVICES=visible)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.strip() == (
        "run_multi_card_FPS: error: CUDA_VISIBLE_DEVICES=%s names card %d but nvidia-smi "
        "lists 2 on this host (from 0); CUDA would hide every card from it on and ranks "
        "would share the rest; export cards it has, e.g. CUDA_VISIBLE_DEVICES=0,1"
        % (visible, card))
  assert sorted(os.listdir(str(tmp_path))) == ["gpu_bin", "python_bin"]


def test_a_gpu_split_into_mig_slices_counts_its_slices(tmp_path, monkeypatch):
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  smi = bin_dir / "nvidia-smi"
  smi.write_text("#!/bin/sh\necho 'GPU 0: A100 (UUID: GPU-0)'\n"
                 "echo '  MIG 3g.20gb     Device  0: (UUID: MIG-a)'\n"
                 "echo '  MIG 3g.20gb     Device  1: (UUID: MIG-b)'\n"
                 "echo 'GPU 1: A100 (UUID: GPU-1)'\n")
  smi.chmod(0o755)
  monkeypatch.setenv("PATH", "%s:%s" % (bin_dir, os.environ["PATH"]))
  assert launch_plan.listed_cards() == (3, "nvidia-smi")


def test_hosts_given_without_a_controller_keep_gloo_and_mpi_options_keep_mpi(tmp_path):
  result = run_multi_card_script(tmp_path, "--input_files_dir=/data", DRY_RUN="1",
                                 IX_NUM_CUDA_VISIBLE_DEVICES="8", HOROVOD_RUN_ARGS="-H h1,h2")
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith("Launching 16 ranks on 2 hosts (8 per host): horovodrun "
                                  "-np 16 -H h1:8,h2:8 --gloo python3 -m ")
  result = run_multi_card_script(tmp_path, "--input_files_dir=/data", DRY_RUN="1",
                                 IX_NUM_CUDA_VISIBLE_DEVICES="8",
                                 HOROVOD_RUN_ARGS="-H h1,h2 --mpi-args=--bind-to=none")
  assert result.returncode == 0, result.stderr
  assert "-H h1:8,h2:8 --mpi-args=--bind-to=none python3 -m " in result.stdout


def test_a_dry_run_prints_the_plan_and_the_command_and_starts_nothing(tmp_path):
  (tmp_path / "hosts").write_text("host1 slots=8\nhost2\n")
  result = run_multi_card_script(
      tmp_path, "--input_files_dir=/data/train", "--output_dir=/ckpt dir", DRY_RUN="1",
      IX_NUM_CUDA_VISIBLE_DEVICES="8",
      HOROVOD_RUN_ARGS="--gloo --hostfile hosts --network-interface eth0")
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == [
      "Launching 16 ranks on 2 hosts (8 per host): horovodrun -np 16 -H host1:8,host2:8 --gloo "
      "--network-interface eth0 python3 -m bert_pretrain.run_pretraining --preset=multi_card "
      "--input_files_dir=/data/train --output_dir=/ckpt\\ dir",
      "DRY_RUN=1: the flags check out (each host checks its files as the job starts); nothing "
      "was started"]
  assert sorted(os.listdir(str(tmp_path))) == ["hosts"]
  # The settings that need no file are the same on every host: checked here.
  zero = run_multi_card_script(tmp_path, "--input_files_dir=/data/train", "--train_batch_size=0",
                               DRY_RUN="1", IX_NUM_CUDA_VISIBLE_DEVICES="8",
                               HOROVOD_RUN_ARGS="--gloo --hostfile hosts")
  assert zero.returncode == 2, zero.stdout + zero.stderr
  assert zero.stderr.strip().splitlines() == [
      "run_multi_card_FPS: error: --train_batch_size=0 must be at least 1"], zero.stderr


@pytest.mark.parametrize("values,message", [
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "8", "HOROVOD_RUN_ARGS": "--gloo -H h1:4,h2:4"},
     "run_multi_card_FPS: error: host h1 has 4 slots in -H h1:4,h2:4 but the count per host is 8"),
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "8", "HOROVOD_RUN_ARGS": "--gloo --hostfile nowhere"},
     "run_multi_card_FPS: error: cannot read the hostfile nowhere"),
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "8", "HOROVOD_RUN_ARGS": "--gloo -H 'h1"},
     "run_multi_card_FPS: error: HOROVOD_RUN_ARGS cannot be split into arguments"),
    # horovodrun's own complaints, in one line rather than after its usage text.
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "2", "HOROVOD_RUN_ARGS": "--glooo"},
     "run_multi_card_FPS: error: HOROVOD_RUN_ARGS: horovodrun says unrecognized arguments: "
     "--glooo; horovodrun --help lists its options"),
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "2", "HOROVOD_RUN_ARGS": "--gloo --mpi"},
     "run_multi_card_FPS: error: HOROVOD_RUN_ARGS: horovodrun says argument --mpi: not "
     "allowed with argument --gloo"),
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "2", "DISTRIBUTION": "multi_worker_mirrored",
      "HOROVOD_RUN_ARGS": "--gloo -H h1:2,h2:2 --start-timeout soon"},
     "run_multi_card_FPS: error: HOROVOD_RUN_ARGS: horovodrun says argument --start-timeout: "
     "invalid int value: 'soon'"),
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "2", "HOROVOD_RUN_ARGS": "--gloo --config-file /no.yaml"},
     "run_multi_card_FPS: error: HOROVOD_RUN_ARGS: horovodrun cannot start with them: [Errno "
     "2] No such file or directory: '/no.yaml'"),
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "2", "HOROVOD_RUN_ARGS": "--network-interface"},
     "run_multi_card_FPS: error: HOROVOD_RUN_ARGS ends with --network-interface, which "
     "takes a value; give it one or drop it"),
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "2", "HOROVOD_RUN_ARGS": "gloo"},
     "run_multi_card_FPS: error: HOROVOD_RUN_ARGS has 'gloo', which is no option: "
     "horovodrun would start it as the ranks' command; drop it (or --gloo?)"),
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "2", "HOROVOD_RUN_ARGS": "--gloo -H localhost:2 extra"},
     "run_multi_card_FPS: error: HOROVOD_RUN_ARGS has 'extra', which is no option"),
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "2", "HOROVOD_RUN_ARGS": "--gloo python3"},
     "run_multi_card_FPS: error: HOROVOD_RUN_ARGS has 'python3', which is no option: "
     "horovodrun would start it as the ranks' command; drop it"),
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "2", "HOROVOD_RUN_ARGS": "--gloo -v"},
     "run_multi_card_FPS: error: HOROVOD_RUN_ARGS has -v, which makes horovodrun print its "
     "version and start no job; drop it (--verbose is its verbose option)"),
    ({"IX_NUM_CUDA_VISIBLE_DEVICES": "2", "HOROVOD_RUN_ARGS": "--gloo --check-build"},
     "run_multi_card_FPS: error: HOROVOD_RUN_ARGS has --check-build, which makes horovodrun "
     "print its build check and start no job; drop it"),
])
def test_the_launcher_stops_on_a_contradiction_before_starting_anything(values, message,
                                                                       tmp_path):
  result = run_multi_card_script(tmp_path, **values)  # no --input_files_dir: the demo would be made
  assert result.returncode == 2
  assert result.stdout == ""
  errors = result.stderr.splitlines()
  assert len(errors) == 1 and errors[0].startswith(message), result.stderr
  assert os.listdir(str(tmp_path)) == []
