"""The progress sink in a batch log (no terminal): plain lines that show the reward rising."""

from hpcrl.metrics.sinks import ProgressBar


def test_without_a_terminal_progress_prints_plain_lines_at_evaluations(capsys):
    bar = ProgressBar(total_steps=4)
    bar.write({"step": 0, "reward/mean": 0.1, "reward/heldout": 0.05})
    bar.write({"step": 1, "reward/mean": 0.2})
    bar.write({"step": 2, "reward/mean": 0.6, "reward/heldout": 0.7})
    bar.write({"step": 4, "reward/heldout": 0.9})  # final eval-only record
    bar.close()
    lines = capsys.readouterr().err.strip().splitlines()
    without_elapsed = [line.rsplit("  ", 1)[0] for line in lines]
    assert without_elapsed == [
        "step 1/4  reward 0.100  held-out 0.050",
        "step 3/4  reward 0.600  held-out 0.700",
        "step 4/4  held-out 0.900",
    ]
