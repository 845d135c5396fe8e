"""Numbers that the README, docs/results.md and the notebooks' prose quote from a stored run are read
here from the stored output they quote, so that re-executing a notebook (or retraining a model) cannot
leave a sentence behind that its own outputs contradict. No kernel is needed: the tests parse the
committed .ipynb files."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
RESULTS = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")


def notebook(stem: str) -> list[dict]:
    return json.loads((ROOT / "notebooks" / f"{stem}.ipynb").read_text(encoding="utf-8"))["cells"]


def markdown(stem: str) -> str:
    """All prose of a notebook, its line breaks made spaces (sentences wrap anywhere)."""
    text = "\n".join("".join(c["source"]) for c in notebook(stem) if c["cell_type"] == "markdown")
    return re.sub(r"\s+", " ", text)


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def stored_output(stem: str, pattern: str) -> re.Match:
    """The first match of `pattern` in the stored text outputs of notebook `stem`."""
    for cell in notebook(stem):
        for output in cell.get("outputs", []):
            text = "".join(output.get("text", "")) or "".join(output.get("data", {}).get("text/plain", ""))
            if (found := re.search(pattern, text, re.MULTILINE)):
                return found
    pytest.fail(f"notebooks/{stem}.ipynb has no stored output matching {pattern!r}: re-execute it")


def course_model_steps() -> int:
    """The course model's training steps, from the settings `course_model` trains it with (a settings
    object, or the command line's arguments in older checkouts)."""
    from transformer_lib import course
    if hasattr(course, "COURSE_MODEL"):
        return course.COURSE_MODEL.max_steps
    args = course.COURSE_MODEL_ARGS
    return int(args[args.index("--max-steps") + 1])


def test_course_model_step_count_is_the_one_it_trains_with():
    steps = course_model_steps()
    assert f"({steps} steps, about 1M parameters)" in flat(README)
    assert f"{steps} steps, about 1M parameters" in flat(RESULTS)
    assert f"trained for {steps} steps" in markdown("13_evaluation")
    assert f"almost without error in {steps} training steps" in markdown("10_data_pipeline")


def test_notebook_13_exact_match_is_the_stored_one():
    greedy = stored_output("13_evaluation", r"^greedy\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")
    bleu, exact = float(greedy.group(1)), float(greedy.group(4))
    imperfect = int(stored_output("13_evaluation", r"^(\d+) of 500 test translations are imperfect").group(1))
    assert imperfect == round(500 * (100 - exact) / 100)
    assert f"500 test pairs with {exact:.1f}% exact match with greedy search in the run stored in notebook 13" \
        in flat(README)
    assert f"it translates {exact:.1f}% of the 500 test pairs exactly with greedy search (greedy BLEU {bleu:.1f})" \
        in flat(RESULTS)
    stored_here = "in the run stored here it translates all 500" if imperfect == 0 else \
        f"in the run stored here it translates {500 - imperfect} of them"
    assert stored_here in markdown("13_evaluation")


def test_notebook_09_exact_match_and_attention_are_the_stored_ones():
    exact = 100 * float(stored_output("09_transformer", r"^exact match: ([\d.]+)$").group(1))
    weights = [float(w) for w in stored_output(
        "09_transformer", r"weight on source position L - 1 - t, per decoder layer: \[([\d., ]+)\]").group(1).split(",")]
    assert f"reverses 1,000 held-out sequences, none of them in its training stream (the notebook asserts it), " \
        f"with {exact:.1f}% exact match in the run stored in the notebook" in flat(README)
    assert f"it reaches {exact:.1f}% exact match on these 1,000 held-out sequences" in flat(RESULTS)
    # "Held out" is what the notebook checks: its 1,000 test sources, none of them in the training stream.
    test_set = stored_output("09_transformer", r"^test: ([\d,]+) sources, \d+ distinct; in the training stream: (\d+)$")
    assert (test_set.group(1), test_set.group(2)) == ("1,000", "0"), test_set.group(0)
    assert "We test on 1 000 sources drawn from the held-out tenth" in markdown("09_transformer")
    assert "its decoder layers put " + " and ".join(f"{w:.2f}" for w in weights) in flat(RESULTS)
    # The prose reads the stored figure as "the second decoder layer forms the anti-diagonal".
    if "In the run stored here, the second decoder layer's weights form the anti-diagonal" in markdown("09_transformer"):
        assert weights[1] == max(weights) and weights[1] >= 0.4, weights


def test_notebook_13_prose_quotes_its_stored_head_alignment():
    layers = {int(m.group(1)): [float(v) for v in re.findall(r"head \d+:\s*([\d.]+)%", m.group(2))]
              for m in re.finditer(r"^layer (\d+): (.*)$", stored_output(
                  "13_evaluation", r"^layer 1: head 1:(?:.|\n)*^layer 2: .*$").group(0), re.MULTILINE)}
    last, first = layers[max(layers)], layers[1]
    assert (f"the heads of the last decoder layer align {min(last):.1f} to {max(last):.1f}% of the words "
            f"and those of the first layer {min(first):.1f} to {max(first):.1f}%") in markdown("13_evaluation")


def test_notebook_13_prose_quotes_its_stored_length_groups():
    groups = stored_output("13_evaluation", r"^unusual subjects \(§5\), BLEU / chrF by group: (.*)$").group(1)
    bleu = [float(b) for b in re.findall(r": ([\d.]+) /", groups)]
    chrf = [float(c) for c in re.findall(r"/ ([\d.]+)", groups)]
    assert (f"BLEU {min(bleu):.0f} to {max(bleu):.0f} and chrF {min(chrf):.0f} to {max(chrf):.0f} in each group"
            in markdown("13_evaluation"))


def test_notebook_14_prose_quotes_its_stored_share_of_the_peak():
    share = stored_output("14_scaling_out", r"training step at d_model 512: \d+ GFLOP/s, (\d+)% of it").group(1)
    assert f"in the run stored here, {share}%" in markdown("14_scaling_out")
    flops = stored_output("14_scaling_out", r"^FLOP model: ([\d.]+)x from length 16 to 512; slope against "
                                            r"d_model \(log-log\): ([\d.]+), ([\d.]+), ([\d.]+)$")
    prose = markdown("14_scaling_out")
    assert f"by a factor of {float(flops.group(1)):.1f} from 16 to 512 positions" in prose
    assert f"from {flops.group(2)} between 64 and 128 to {flops.group(4)} between 256 and 512" in prose


def test_one_course_run_time_is_quoted_everywhere():
    """README, CONTRIBUTING and notebook 00 quote the same measured course run: its total, and
    notebook 00's per-notebook column from that run (notebook 11 the longest, as the README says)."""
    contributing = flat((ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8"))
    readme, course_map = flat(README), markdown("00_course_map")
    minutes_seconds = [re.search(pattern, text) for pattern, text in (
        (r"Running the whole course took (\d+) min (\d+) s", readme),
        (r"`bash scripts/run_course\.sh` took (\d+) min (\d+) s", contributing),
        (r"the whole course took (\d+) min (\d+) s", course_map))]
    assert all(minutes_seconds), "a course-run time is missing from README, CONTRIBUTING or notebook 00"
    totals = {60 * int(m[1]) + int(m[2]) for m in minutes_seconds}
    assert len(totals) == 1, f"three places, {len(totals)} different course-run times: {sorted(totals)}"
    total = totals.pop()
    assert re.search(rf"`bash scripts/run_course\.sh` took \d+ min \d+ s \({total} s\)", contributing)
    rows = re.findall(r"\| \[?(\d\d) ·[^|]*\|[^|]*\|[^|]*\| (\d+) s \| \d+ min \|", course_map)
    run = {number: int(seconds) for number, seconds in rows}
    assert sorted(run) == [f"{n:02d}" for n in range(15)], "notebook 00's table lacks a run time"
    assert max(run, key=run.get) == "11"
    assert int(re.search(r"notebook 11, which trains the course model, is the longest: (\d+) s", readme)[1]) == run["11"]
    # the total adds the final translation and the scripts' own start to the notebooks' times
    assert sum(run.values()) <= total <= sum(run.values()) + 60
