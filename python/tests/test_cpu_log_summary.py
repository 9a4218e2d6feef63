"""scripts/cpu_log_summary.py: the device check's cpu.log summed up per
measurement, rounds together, medians worked out by hand below."""
import os
import subprocess
import sys

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)

from cpu_log_summary import render, summarise  # noqa: E402

BENCH = ('{"impl":"seqpack","threads":%d,"precision":"bf16","workload":"w","mode":"m",'
         '"sec_per_batch":%s,"tokens_per_s":1,"cpu_sec_per_batch":1,"reps":3}')

BENCH_CORE = ('{"impl":"seqpack","threads":4,"precision":"bf16","workload":"w","mode":"train_packed",'
              '"sec_per_batch":%s,"tokens_per_s":1,"cpu_sec_per_batch":1,"reps":3,'
              '"core_sec_per_call":{"forward_inputs":0.0001,"forward_steps":%s,"forward_states":0,'
              '"backward_prepare":0,"backward_steps":%s,"backward_weights":%s,"backward_inputs":0}}')

LOG = [
    "$ bash -c sweep\n",
    "seqpack          0.1.0\n",
    "--- pairs round 1, w, threads 1, m, bf16\n",
    "bench [1/1] w m (threads 1, 10 tokens)...\n",
    BENCH % (1, "0.010") + "\n",
    "--- pairs round 1, w, threads 2, m, bf16\n",
    BENCH % (2, "0.004") + "\n",
    "--- pairs round 2, w, threads 1, m, bf16\n",
    BENCH % (1, "0.030") + "\n",
    "--- pairs round 2, w, threads 2, m, bf16\n",
    BENCH % (2, "0.006") + "\n",
    "--- pairs round 3, w, threads 1, m, bf16\n",
    BENCH % (1, "0.020") + "\n",
    "--- pairs round 3, w, threads 2, m, bf16\n",
    "(not run: exit 124)\n",
    "--- others round 1, w, threads 4, train_packed, bf16\n",
    BENCH_CORE % ("0.008", "0.003", "0.002", "0.001") + "\n",
    "--- others round 2, w, threads 4, train_packed, bf16\n",
    BENCH_CORE % ("0.010", "0.005", "0.004", "0.002") + "\n",
    "--- main job new, round 1, threads 16\n",
    "time: wall 2.0 s, user 30 s, system 1 s\n",
    "step profile (cpu s): total 11.7, batch 0.08 (0.7%), forward 4.7 (40.6%), backward 6.3 (54.2%)\n",
    "step profile (wall s): total 0.788, batch 0.009 (1.2%), forward 0.196 (24.8%), loss 0.004 "
    "(0.6%), backward 0.512 (64.9%), clip 0.029 (3.7%)\n",
    "epoch 1/2: train loss 0.98, validation accuracy 78.01%, 0.79 s, cpu 11.77 s "
    "(34114 words/s, 346204 tokens/s)\n",
    "step profile (wall s): total 0.486, batch 0.009 (1.8%), forward 0.131 (26.8%), loss 0.004 "
    "(0.8%), backward 0.280 (57.6%), clip 0.027 (5.6%)\n",
    "rnn core profile (wall s): forward 0.131: inputs 0.010 (7.6%), steps 0.090 (68.7%), states "
    "0.001 (0.8%), rest 0.030 (22.9%); backward 0.280: prepare 0.020 (7.1%), steps 0.150 (53.6%), "
    "weights 0.060 (21.4%), inputs 0.000 (0.0%), rest 0.050 (17.9%)\n",
    "epoch 2/2: train loss 0.53, validation accuracy 83.66%, 0.49 s, cpu 7.28 s "
    "(55267 words/s, 560881 tokens/s)\n",
    "--- main job new, round 2, threads 16\n",
    "step profile (wall s): total 0.9, batch 0.01 (1%), forward 0.255 (26%), loss 0.007 (0.7%), "
    "backward 0.636 (60%), clip 0.03 (3%)\n",
    "rnn core profile (wall s): forward 0.255: inputs 0.010 (3.9%), steps 0.200 (78.4%), states "
    "0.001 (0.4%), rest 0.044 (17.3%); backward 0.636: prepare 0.020 (3.1%), steps 0.450 (70.8%), "
    "weights 0.100 (15.7%), inputs 0.000 (0.0%), rest 0.066 (10.4%)\n",
    "epoch 2/2: train loss 0.53, validation accuracy 83.66%, 0.97 s, cpu 14.48 s "
    "(28000 words/s, 281000 tokens/s)\n",
    "--- main job new, round 3, threads 16\n",
    "(not run: exit 124)\n",
]


def test_rounds_come_together_with_their_medians():
    rows = summarise(LOG)
    assert [r[0] for r in rows] == [
        "pairs w, threads 1, m, bf16",
        "pairs w, threads 2, m, bf16",
        "others w, threads 4, train_packed, bf16",
        "main job new, threads 16",
    ]
    one, two, others, main = rows
    assert one[1] == "ms" and one[2] == [10.0, 30.0, 20.0]
    assert two[2] == [4.0, 6.0]  # the round that did not run has no value
    # The main job: the last epoch of each run, and its wall profile.
    assert main[1] == "tokens/s" and main[2] == [560881, 281000]
    assert main[3] == ((0.131 + 0.255) / 2, (0.280 + 0.636) / 2)
    # The core's time loops and weight gradients of those epochs.
    assert main[4] == ((0.090 + 0.200) / 2, (0.150 + 0.450) / 2, (0.060 + 0.100) / 2)
    assert one[3] is None and one[4] is None
    # bench --profile's core parts, ms per call, medians over the rounds.
    assert others[2] == [8.0, 10.0]
    assert others[4] == ((3.0 + 5.0) / 2, (2.0 + 4.0) / 2, (1.0 + 2.0) / 2)


def test_table_shows_rounds_and_medians():
    table = render(summarise(LOG)).splitlines()
    assert table[2] == "| pairs w, threads 1, m, bf16 | ms | 10, 30, 20 | 20 |  |  |"
    assert table[3] == "| pairs w, threads 2, m, bf16 | ms | 4, 6 | 5 |  |  |"
    assert table[4] == "| others w, threads 4, train_packed, bf16 | ms | 8, 10 | 9 |  | 4 / 3, 1.5 |"
    assert table[5] == ("| main job new, threads 16 | tokens/s | 561k, 281k | 421k | 0.193 / 0.458 "
                        "| 0.145 / 0.300, 0.080 |")


def test_command_line(tmp_path):
    log = tmp_path / "cpu.log"
    log.write_text("".join(LOG))
    script = os.path.join(SCRIPTS, "cpu_log_summary.py")
    ok = subprocess.run([sys.executable, script, str(log)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "| main job new, threads 16 |" in ok.stdout
    missing = subprocess.run([sys.executable, script, str(tmp_path / "absent.log")],
                             capture_output=True, text=True)
    assert missing.returncode == 1
    assert "absent.log" in missing.stderr
    empty = tmp_path / "empty.log"
    empty.write_text("== cpu: skipped: no CUDA GPU\n")
    none = subprocess.run([sys.executable, script, str(empty)], capture_output=True, text=True)
    assert none.returncode == 0 and "no measurements" in none.stdout
