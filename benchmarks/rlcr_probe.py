"""Does the model know, at its confidence turn, which of its answers are right? A linear probe on its hidden state.

    python benchmarks/rlcr_probe.py --tag cpu RUN_DIR     # the warm-up model and RUN_DIR's trained model

RLCR asks the model to state, in a second turn, how likely its own answer is right. On the embedded default the
stated confidence ends at one value per difficulty level (AUROC within levels 0.50, docs/benchmarks.md). This
measures whether the information was there to be stated: for each model, each question's greedy answer is put in the
confidence turn exactly as training builds it, and the hidden state at the last prompt token (where the confidence's
first token is predicted) is read at a middle and the last layer. A logistic regression on it is fitted on
train-split questions (past the warm-up's rows, whose gold answers the warm-up was fine-tuned on), its regularisation
chosen on the tune split by AUROC within levels, and scored once on the report split, beside two references that need
no fitting: the probability the model gave its own greedy answer (one forward, no samples) and the stated confidence.

A probe well above 0.5 within levels says the confidence turn sees what it would need, and the stated confidence fails
to read it out; a probe at 0.5 says the representation at this scale does not hold it. Writes
`benchmarks/results/rlcr_probe_<tag>.{json,jsonl,png}`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from common import load_model, results_dir, rlcr_cpu_run, write_result
from tqdm.auto import tqdm


C_GRID = (0.001, 0.01, 0.1, 1.0)
SPLITS = ("fit", "tune", "report")
FIT_SIZES = (64, 128, 256, 512)  # the learning curve's fit-set sizes (and the whole fit set)
TARGET = 0.60  # issue 34's AUROC-within-levels target for the stated confidence


@torch.no_grad()
def features(model, tokenizer, rows, args, accuracy, layers, batch_size, stated: bool) -> dict:
    """Per row: whether the greedy answer is right, its level, the hidden states at the confidence turn's last prompt
    token (one array per layer), the probability of the answer's tokens, and (with `stated`) the greedy stated
    confidence and the stated distribution's mean over tenths ([`expected_tenths`])."""
    from trl_ext.core.turns import follow_up_turn
    from trl_ext.evaluation.greedy import completion_probabilities, greedy_completions, left_padded
    from trl_ext.rewards import extract_answer, extract_confidence

    kwargs = args.chat_template_kwargs or {}
    eos = tokenizer.eos_token_id
    turn = follow_up_turn(tokenizer, args.confidence_prompt, [eos], **kwargs)
    out = {"correct": [], "level": [], "answer": [], "answer_prob": [], "stated": [], "expected": []}
    out.update({f"layer{layer}": [] for layer in layers})
    for start in tqdm(range(0, len(rows), batch_size), desc="probe features"):
        batch = rows[start : start + batch_size]
        prompts = turn.first_turn_ids(tokenizer, batch["prompt"], **kwargs)
        answers = greedy_completions(model, tokenizer, prompts, args.max_completion_length)
        turn2 = [turn.prompt_ids(p, a, [eos]) for p, a in zip(prompts, answers)]
        out["answer_prob"] += completion_probabilities(model, tokenizer, prompts, answers)
        input_ids, mask, _ = left_padded(turn2, tokenizer.pad_token_id, model.device)
        hidden = model(input_ids=input_ids, attention_mask=mask, output_hidden_states=True).hidden_states
        for i in range(len(turn2)):
            for layer in layers:
                out[f"layer{layer}"].append(hidden[layer][i, -1].float().numpy())
        if stated:
            out["expected"] += expected_tenths(model, tokenizer, turn2, args.confidence_tag)
            confidences = greedy_completions(model, tokenizer, turn2, args.max_confidence_length)
            out["stated"] += [
                extract_confidence(
                    tokenizer.decode(c, skip_special_tokens=True), args.confidence_tag, args.lenient_parsing
                )
                for c in confidences
            ]
        for gold, answer in zip(batch[args.solution_column], answers):
            text = tokenizer.decode(answer, skip_special_tokens=True)
            prediction = extract_answer(text, args.answer_tag, args.lenient_parsing)
            out["correct"].append(int(bool(prediction) and accuracy(str(gold), prediction)))
            out["answer"].append(text)
        out["level"] += list(batch["level"])
    return out


@torch.no_grad()
def expected_tenths(model, tokenizer, turn2: list[list[int]], tag: str) -> list[float]:
    """Per confidence-turn prompt, the mean of the eleven tenths 0.0-1.0 weighted by the probability the model gives
    to stating each (`<tag>0.3`, teacher-forced, renormalised over the eleven): the stated distribution's mean, where
    greedy decoding reads its mode. Candidates that differ only in their last token share one forward."""
    from trl_ext.evaluation.greedy import left_padded

    values = [k / 10 for k in range(11)]
    by_prefix = {}
    for i, value in enumerate(values):
        ids = tokenizer.encode(f"<{tag}>{value:.1f}", add_special_tokens=False)
        by_prefix.setdefault(tuple(ids[:-1]), []).append((i, ids[-1]))
    logp = torch.zeros(len(turn2), len(values))
    for prefix, members in by_prefix.items():
        input_ids, mask, _ = left_padded([t + list(prefix) for t in turn2], tokenizer.pad_token_id, model.device)
        logits = model(input_ids=input_ids, attention_mask=mask, logits_to_keep=len(prefix) + 1).logits
        lp = torch.log_softmax(logits.float(), dim=-1).cpu()
        said = sum(lp[:, j, t] for j, t in enumerate(prefix))  # the shared tokens, each predicted one position earlier
        for i, last in members:
            logp[:, i] = said + lp[:, -1, last]
    return (torch.softmax(logp, dim=-1) @ torch.tensor(values)).tolist()


def probe(data: dict, layer: str, seed: int, fit_rows=None, intervals: bool = True) -> dict:
    """Fit on the `fit` split (or its rows `fit_rows`), choose C on `tune` by AUROC within levels, score `report`."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from trl_ext.evaluation.calibration import calibration_report, grouped_auroc

    x = {s: np.stack(data[s][layer]) for s in SPLITS}
    y = np.asarray(data["fit"]["correct"])
    rows = np.arange(len(y)) if fit_rows is None else np.asarray(fit_rows)

    def fitted(c):
        model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000, random_state=seed))
        return model.fit(x["fit"][rows], y[rows])

    models = {c: fitted(c) for c in C_GRID}
    tune = {
        c: grouped_auroc(m.predict_proba(x["tune"])[:, 1], data["tune"]["correct"], data["tune"]["level"])
        for c, m in models.items()
    }
    best = max(C_GRID, key=lambda c: tune[c])
    scores = models[best].predict_proba(x["report"])[:, 1]
    report = calibration_report(
        scores, data["report"]["correct"], groups=data["report"]["level"], intervals=intervals, seed=seed
    )
    return {"C": best, "tune_auroc_within_levels": tune, "report": report.to_dict(), "scores": scores.tolist()}


def learning_curve(data: dict, layer: str, seed: int, sizes, repeats: int) -> dict:
    """The probe's report-split AUROC within levels when fitted on `n` of the fit questions (`repeats` random draws
    per size): how many labelled answers reading the correctness out takes."""
    rng = np.random.default_rng(seed)
    total = len(data["fit"]["correct"])
    return {
        str(n): [
            probe(data, layer, seed, rng.choice(total, n, replace=False), intervals=False)["report"][
                "auroc_within_groups"
            ]
            for _ in range(repeats)
        ]
        for n in sizes
        if n < total
    }


def reference(data: dict, key: str, seed: int) -> dict:
    """A score that needs no fitting, on the report split (rows where it is missing left out)."""
    from trl_ext.evaluation.calibration import calibration_report

    rows = [i for i, v in enumerate(data["report"][key]) if v is not None]
    pick = lambda name: [data["report"][name][i] for i in rows]  # noqa: E731
    report = calibration_report(pick(key), pick("correct"), groups=pick("level"), intervals=True, seed=seed)
    return {"report": report.to_dict(), "rows": len(rows)}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(result["models"])
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2), sharey=True)
    for ax, metric in zip(axes, ("auroc_within_groups", "auroc")):
        for m, name in enumerate(models):
            scores = result["models"][name]["scores"]
            for k, entry in enumerate(scores.values()):
                value = entry["report"][metric]
                if value is None:
                    continue
                low, high = entry["report"]["intervals"].get(metric) or (value, value)
                x = k + (m - (len(models) - 1) / 2) * 0.3
                ax.errorbar(
                    x,
                    value,
                    yerr=[[value - low], [high - value]],
                    fmt="o",
                    capsize=3,
                    color=f"C{m}",
                    label=name if k == 0 else None,
                )
            ax.set_xticks(range(len(scores)), list(scores), rotation=20, fontsize=8)
        ax.axhline(0.5, color="grey", lw=0.8, ls="--")
        if metric == "auroc_within_groups":
            ax.axhline(TARGET, color="C3", lw=0.8, ls=":", label=f"target {TARGET}")
        ax.set_title(metric.replace("_groups", " levels").replace("_", " ") + " (report split, 95% interval)")
        ax.legend(fontsize=8)
    ax = axes[2]
    for m, name in enumerate(models):
        for k, (label, curve) in enumerate(result["models"][name]["learning_curve"].items()):
            sizes = [int(n) for n in curve] + [result["fit_samples"]]
            whole = result["models"][name]["scores"][label]["report"]["auroc_within_groups"]
            values = [curve[str(n)] for n in sizes[:-1]] + [[whole]]
            ax.plot(sizes, [np.mean(v) for v in values], "o-" if k else "s--", color=f"C{m}", label=f"{name}, {label}")
            ax.fill_between(sizes, [min(v) for v in values], [max(v) for v in values], color=f"C{m}", alpha=0.1)
    ax.set_xscale("log")
    ax.axvline(
        result["rl_answers"], color="grey", lw=0.8, label=f"answers one RL run is rewarded on ({result['rl_answers']})"
    )
    ax.axhline(TARGET, color="C3", lw=0.8, ls=":")
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("labelled answers the probe is fitted on")
    ax.set_title("probe AUROC within levels (report) by fit size")
    ax.legend(fontsize=7)
    fig.suptitle(
        "Correctness of the greedy answer, read at the confidence turn (linear probes) or stated (dashed: chance)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", help="An RLCR recipe output directory of the embedded default (metrics.json).")
    parser.add_argument("--tag", default="cpu")
    parser.add_argument(
        "--fit_samples",
        type=int,
        default=1200,
        help="Train-split questions drawn past the warm-up's (repeats dropped).",
    )
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5, help="Random fit subsets per learning-curve size.")
    parser.add_argument("--seed", type=int, default=42)
    cli = parser.parse_args()

    from trl_ext.data.graded_arithmetic import graded_arithmetic, normalise_question
    from trl_ext.evaluation.records import prompt_text
    from trl_ext.recipe.rlcr import accuracy_func
    from trl_ext.rewards.verify import verify_answer

    run_dir = Path(cli.run_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    script_args, args, _, report_rows = rlcr_cpu_run(("--seed", str(cli.seed)))
    _, _, _, tune_rows = rlcr_cpu_run(("--seed", str(cli.seed), "--eval_split", "tune"))
    # Train-split questions past the warm-up's rows (the generator is prefix-stable: rows 200-599 are the RL rows),
    # each once and none the warm-up was fine-tuned on.
    skip = script_args.warmup_samples
    drawn = graded_arithmetic(skip + cli.fit_samples, seed=cli.seed, system_prompt=script_args.system_prompt)
    seen = {normalise_question(q) for q in drawn["question"][:skip]}
    keep = []
    for i in range(skip, len(drawn)):
        key = normalise_question(drawn[i]["question"])
        if key not in seen:
            seen.add(key)
            keep.append(i)
    fit_rows = drawn.select(keep)
    rows = {"fit": fit_rows, "tune": tune_rows, "report": report_rows}
    accuracy = accuracy_func(script_args) or verify_answer

    result = {
        "run_dir": str(run_dir),
        "fit_samples": len(fit_rows),
        "C_grid": list(C_GRID),
        # the answers one run of the recipe is rewarded on (one process): what RL has to learn the readout from
        "rl_answers": args.max_steps * args.per_device_train_batch_size * args.gradient_accumulation_steps,
        "models": {},
    }
    records = []
    for name, path in (("warm-up", metrics["warmup"]["model"]), ("after RL", str(run_dir))):
        model, tokenizer = load_model(path)
        model.eval()
        layers = (model.config.num_hidden_layers // 2, model.config.num_hidden_layers)
        clock = time.monotonic()
        data = {
            s: features(model, tokenizer, rows[s], args, accuracy, layers, cli.batch_size, stated=s != "fit")
            for s in SPLITS
        }
        entry = {
            "model": path,
            "accuracy": {s: float(np.mean(data[s]["correct"])) for s in SPLITS},
            "scores": {},
        }
        probes = {f"probe, layer {layer}": probe(data, f"layer{layer}", cli.seed) for layer in layers}
        entry["scores"] = {
            **{k: {key: v for key, v in p.items() if key != "scores"} for k, p in probes.items()},
            "answer probability": reference(data, "answer_prob", cli.seed),
            "stated confidence": reference(data, "stated", cli.seed),
            "stated confidence, mean over tenths": reference(data, "expected", cli.seed),
        }
        entry["learning_curve"] = {
            f"probe, layer {layer}": learning_curve(data, f"layer{layer}", cli.seed, FIT_SIZES, cli.repeats)
            for layer in layers
        }
        entry["seconds"] = time.monotonic() - clock
        result["models"][name] = entry
        report = data["report"]
        for i, row in enumerate(rows["report"]):
            records.append(
                {
                    "model": name,
                    "prompt": prompt_text(row["prompt"]),
                    "group": report["level"][i],
                    "answer": report["answer"][i],
                    "correct": report["correct"][i],
                    "confidence": report["stated"][i],
                    "answer_prob": report["answer_prob"][i],
                    "confidence_mean_over_tenths": report["expected"][i],
                    **{k: p["scores"][i] for k, p in probes.items()},
                }
            )
        print(
            name, {k: (v["report"]["auroc_within_groups"], v["report"]["auroc"]) for k, v in entry["scores"].items()}
        )
        del model

    out = results_dir() / f"rlcr_probe_{cli.tag}.json"
    write_result(out, result, seeds=[cli.seed], records=records)
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
