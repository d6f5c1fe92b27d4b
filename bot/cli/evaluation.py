"""``kb`` commands that measure: eval, calibrate, and exporting disliked questions to label."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from bot.cli.base import emit, json_option, main, open_kb, output_file_option, settings_of
from bot.settings import Settings
from evaluation import DEFAULT_MAX_BLUFF_RATE
from evaluation.set_check import DEFAULT_SET
from evaluation.strategies import STRATEGIES
from index.embed import model_name

if TYPE_CHECKING:  # evaluation pulls in the engine and the model: only when a command runs
    from evaluation.compare import Side
    from evaluation.results import EvalResult
    from evaluation.variants import Variant
    from index.storage import Store

F = TypeVar("F", bound=Callable[..., Any])


def evalset_options(fn: F) -> F:
    """``--set`` or ``--corpus``, ``--questions``, ``--ood``: an evaluation set."""
    for option in reversed(
        [
            click.option(
                "--set",
                "set_name",
                metavar="NAME",
                default=None,
                help=f"A bundled evaluation set by name (default: {DEFAULT_SET}); "
                "not with --corpus/--questions/--ood.",
            ),
            click.option(
                "--corpus",
                type=click.Path(exists=True, file_okay=False, path_type=Path),
                default=None,
                help="Folder of documents to index (default: the bundled evaluation set).",
            ),
            click.option(
                "--questions",
                type=click.Path(exists=True, dir_okay=False, path_type=Path),
                default=None,
                help="questions.jsonl: id, needle, doc_phrasing, ticket_phrasing.",
            ),
            click.option(
                "--ood",
                type=click.Path(exists=True, dir_okay=False, path_type=Path),
                default=None,
                help="ood.jsonl: id, question (questions the knowledge base should refuse).",
            ),
        ]
    ):
        fn = option(fn)
    return fn


budget_option = click.option(
    "--max-bluff-rate",
    type=click.FloatRange(0.0, 1.0),
    default=DEFAULT_MAX_BLUFF_RATE,
    show_default=True,
    help="Bluff budget: the share of out-of-domain questions allowed to get an answer.",
)
progress_option = click.option("--no-progress", is_flag=True, help="No progress bars on stderr.")


def _evalset(
    set_name: str | None, corpus: Path | None, questions: Path | None, ood: Path | None
) -> tuple[Path, Path, Path]:
    """The set's files: a bundled set by name, or files given one by one over the default set."""
    from evaluation.inputs import EvalSetError, bundled_set

    if set_name is not None and (corpus or questions or ood):
        raise click.UsageError("Use either --set or --corpus/--questions/--ood, not both.")
    try:
        bundled = bundled_set(set_name or DEFAULT_SET)
    except EvalSetError as exc:
        raise click.BadParameter(str(exc), param_hint="--set") from exc
    return corpus or bundled.corpus, questions or bundled.questions, ood or bundled.ood


def _run_evaluation(
    settings: Settings,
    paths: tuple[Path, Path, Path],
    *,
    strategies: tuple[str, ...] = (),
    thresholds: list[float] | None = None,
    threshold: float | None = None,
    progress: bool = True,
    variant: Variant | None = None,
) -> EvalResult:
    from evaluation.inputs import load_ood, load_questions
    from evaluation.run import evaluate
    from index.embed import load_embedder

    corpus, questions_path, ood_path = paths
    index, engine = settings.index_config(), settings.engine_config()
    if variant is not None:
        index, engine = variant.index_config(index), variant.engine_config(engine)
    return evaluate(
        corpus,
        load_questions(questions_path),
        load_ood(ood_path),
        embedder=load_embedder(index),
        index=index,
        engine=engine,
        strategies=strategies,
        thresholds=thresholds,
        threshold=threshold,
        progress=progress,
    )


@main.command("eval")
@evalset_options
@click.option(
    "--strategies",
    is_flag=True,
    help=f"Also compare the chunking strategies {', '.join(STRATEGIES)}.",
)
@click.option(
    "--threshold", type=float, default=None, help="Threshold to evaluate (default: KB_THRESHOLD)."
)
@budget_option
@json_option("Print every number as JSON.")
@output_file_option("--report", "report_path", "Also write the tables as Markdown to this file.")
@output_file_option(
    "--plot", "plot_path", "Also write distance histograms and the threshold sweep as a PNG."
)
@click.option(
    "--baseline",
    "baseline_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="An earlier `kb eval --json` output on the same set: also print both side by side, "
    "with paired sign tests.",
)
@click.option(
    "--compare",
    "compare_specs",
    multiple=True,
    metavar="emb=MODEL,rerank=MODEL",
    help="Give twice: run the set with both model configurations and print the paired table. "
    "emb= is a KB_EMBEDDING_MODEL value, rerank= a KB_RERANKER value (or none); what a "
    "configuration leaves out is the configured setting.",
)
@progress_option
@click.pass_context
def eval_(
    ctx: click.Context,
    set_name: str | None,
    corpus: Path | None,
    questions: Path | None,
    ood: Path | None,
    strategies: bool,
    threshold: float | None,
    max_bluff_rate: float,
    as_json: bool,
    report_path: Path | None,
    plot_path: Path | None,
    baseline_path: Path | None,
    compare_specs: tuple[str, ...],
    no_progress: bool,
) -> None:
    """Measure retrieval (Recall@k, MRR, destroyed answers) and what the threshold costs.

    Indexes the corpus in a temporary data dir with the product's own code; no
    language model is called. --set NAME picks a bundled evaluation set (default:
    pip-black); --corpus/--questions/--ood name your own files instead.

    --baseline FILE also pairs this run with an earlier `kb eval --json` output
    of the same set, query by query (exact sign tests on the queries where they
    differ).

    --compare A --compare B runs the set with two configurations of the
    embedding model and reranker and pairs them the same way.

    Example: kb eval --set prometheus --report eval.md --plot eval.png
    Example: kb eval --compare emb=bundled:all-MiniLM-L6-v2 --compare rerank=./ms-marco-MiniLM
    Example: kb eval --json > before.json; (change something); kb eval --baseline before.json
    """
    from evaluation.calibrate import propose_threshold
    from evaluation.compare import compare, render_comparison
    from evaluation.kept import render_kept
    from evaluation.report import plot, render

    paths = _evalset(set_name, corpus, questions, ood)
    if compare_specs:
        if strategies or baseline_path or plot_path:
            raise click.UsageError(
                "--compare runs alone: not with --strategies, --baseline, --plot."
            )
        _compare_variants(ctx, compare_specs, paths, threshold, as_json, report_path, no_progress)
        return
    baseline = _baseline(baseline_path, paths)
    result = _run_evaluation(
        settings_of(ctx),
        paths,
        strategies=tuple(STRATEGIES) if strategies else (),
        threshold=threshold,
        progress=not no_progress,
    )
    chosen = propose_threshold(result.gate.sweep, max_bluff_rate)
    recommended = chosen.threshold if chosen else None
    comparison = compare(baseline, result, ("baseline", "this run")) if baseline else None
    if report_path is not None:
        report = render(result, markdown=True, recommended=recommended)
        if comparison is not None:
            report += "\n" + render_comparison(comparison, markdown=True)
        report_path.write_text(report, encoding="utf-8")
    if plot_path is not None:
        plot(result, plot_path, recommended=recommended)

    def text() -> None:
        click.echo(render(result, recommended=recommended), nl=False)
        if recommended is not None:
            click.echo(
                f"\nLargest threshold with bluff rate <= {max_bluff_rate:.0%}: {recommended:.3f} "
                f"(configured: {result.gate.threshold:.3f}). See `kb calibrate`."
            )
        click.echo("\n" + render_kept(result.kept), nl=False)
        if comparison is not None:
            click.echo("\n" + render_comparison(comparison), nl=False)

    data = {
        **result.to_dict(),
        "recommended": {
            "rule": "largest threshold whose out-of-domain bluff rate <= max_bluff_rate",
            "max_bluff_rate": max_bluff_rate,
            "threshold": recommended,
        },
    }
    if comparison is not None:
        data["comparison"] = comparison.to_dict()
    emit(data, as_json, text)


def _compare_variants(
    ctx: click.Context,
    specs: tuple[str, ...],
    paths: tuple[Path, Path, Path],
    threshold: float | None,
    as_json: bool,
    report_path: Path | None,
    no_progress: bool,
) -> None:
    """``kb eval --compare A --compare B``: both configurations on the same set, paired."""
    from evaluation.compare import compare, render_comparison
    from evaluation.inputs import EvalSetError
    from evaluation.kept import render_kept
    from evaluation.variants import parse_variant

    if len(specs) != 2:
        raise click.UsageError("Give --compare exactly twice: --compare A --compare B.")
    settings = settings_of(ctx)
    try:
        variants = [
            parse_variant(s, embedding_model=settings.embedding_model, reranker=settings.reranker)
            for s in specs
        ]
    except EvalSetError as exc:
        raise click.BadParameter(str(exc), param_hint="--compare") from exc
    results = [
        _run_evaluation(
            settings, paths, threshold=threshold, progress=not no_progress, variant=variant
        )
        for variant in variants
    ]
    comparison = compare(results[0], results[1], ("A", "B"))
    legend = "".join(f"{n} = {v.label}\n" for n, v in zip("AB", variants, strict=True))

    def text(markdown: bool = False) -> str:
        kept = "".join(f"{n}: " + render_kept(r.kept) for n, r in zip("AB", results, strict=True))
        return legend + "\n" + render_comparison(comparison, markdown=markdown) + "\n" + kept

    if report_path is not None:
        report_path.write_text(text(markdown=True), encoding="utf-8")
    data = {
        "variants": {n: v.label for n, v in zip("AB", variants, strict=True)},
        "comparison": comparison.to_dict(),
        "kept": {
            n: r.kept.to_dict() if r.kept else None for n, r in zip("AB", results, strict=True)
        },
    }
    emit(data, as_json, lambda: click.echo(text(), nl=False))


def _baseline(path: Path | None, paths: tuple[Path, Path, Path]) -> Side | None:
    """The saved result to compare with, checked against this set before any indexing."""
    if path is None:
        return None
    from evaluation.compare import check_same_queries, load_result
    from evaluation.inputs import load_ood, load_questions

    side = load_result(path, "baseline")
    check_same_queries(side, load_questions(paths[1]), load_ood(paths[2]))
    return side


@main.command("export-disliked")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.pass_context
def export_disliked(ctx: click.Context, out: Path) -> None:
    """Write the questions people gave a thumbs-down, as candidate questions to label.

    Writes JSON lines in the shape of questions.jsonl with the needle left
    empty: fill in the passage that should have answered each one and a second
    phrasing (or move it to ood.jsonl), then use it with `kb eval --questions`.

    Example: kb export-disliked disliked.jsonl
    """
    from evaluation.run import export_disliked as export
    from index.storage import Store

    # The query log only: no need to load the embedding model for this.
    count = export(Store(settings_of(ctx).data_dir), out)
    click.echo(f"Wrote {count} thumbs-down questions to {out}; label them before use.")


@main.command()
@evalset_options
@click.option(
    "--from-log",
    "from_log",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Labelled logged questions instead of an evaluation set (JSON lines: question or query_id, and in_domain true/false); searched against this knowledge base.",
)
@budget_option
@click.option(
    "--step",
    type=click.FloatRange(0.001, 0.5),
    default=0.025,
    show_default=True,
    help="Spacing of the thresholds tried (0.20 to 1.00; for a model whose thresholds are "
    "below 0.3, such as multilingual, a fifth of it from 0.05 to 0.40).",
)
@output_file_option(
    "--write-env",
    "env_path",
    "Write KB_THRESHOLD and KB_RELATED_THRESHOLD (the proposed ones) into this .env file, keeping its other lines.",
)
@click.option(
    "--no-save",
    is_flag=True,
    help="Do not save this calibration in the knowledge base (App Home shows the last one saved).",
)
@json_option("Print the calibration as JSON.")
@progress_option
@click.pass_context
def calibrate(
    ctx: click.Context,
    set_name: str | None,
    corpus: Path | None,
    questions: Path | None,
    ood: Path | None,
    from_log: Path | None,
    max_bluff_rate: float,
    step: float,
    env_path: Path | None,
    no_save: bool,
    as_json: bool,
    no_progress: bool,
) -> None:
    """Propose the refusal threshold for a bluff budget, and the related threshold beside it.

    Picks the largest threshold whose out-of-domain bluff rate is within
    --max-bluff-rate, on the bundled evaluation set, your own set, or your
    logged questions labelled in/out of domain (--from-log); then the smallest
    related threshold that refuses at most 5 % of in-domain questions outright,
    as long as at most half of the out-of-domain questions are shown anything.
    The calibration is saved in the knowledge base for App Home (not with --no-save).

    Example: kb calibrate --max-bluff-rate 0.1 --write-env .env
    """
    from evaluation import calibrate as cal
    from evaluation.report import render_calibration

    settings = settings_of(ctx)
    grid = cal.calibration_grid_for(settings.engine_config().threshold, step)
    store: Store | None = None
    if from_log is not None:
        if set_name or corpus or questions or ood:
            raise click.UsageError(
                "Use either --from-log or --set/--corpus/--questions/--ood, not both."
            )
        kb = open_kb(ctx)
        store = kb.store
        inside, outside = cal.load_labelled_log(from_log, kb.store)
        result = cal.from_log(
            kb,
            inside,
            outside,
            top_k=settings.top_k,
            current_threshold=settings.engine_config().threshold,  # the model's when unset
            max_bluff_rate=max_bluff_rate,
            thresholds=grid,
        )
    else:
        evaluation = _run_evaluation(
            settings,
            _evalset(set_name, corpus, questions, ood),
            thresholds=grid,
            progress=not no_progress,
        )
        result = cal.from_evaluation(evaluation, max_bluff_rate=max_bluff_rate)
    emit(result.to_dict(), as_json, lambda: click.echo(render_calibration(result), nl=False))
    if result.proposed is not None and env_path is not None:
        cal.write_env(
            env_path,
            result.proposed.threshold,
            result.proposed_related,
            model=model_name(settings.embedding_model),
        )
        if not as_json:
            value = cal.format_threshold(result.proposed.threshold)
            click.echo(f"Wrote {cal.THRESHOLD_ENV}={value} to {env_path}.")
            if result.proposed_related is not None:
                related = cal.format_threshold(result.proposed_related)
                click.echo(f"Wrote {cal.RELATED_ENV}={related} to {env_path}.")
            click.echo(f"Wrote {cal.MODEL_ENV} (the model they were measured with) to {env_path}.")
    if not no_save:
        from core.calibration import save_calibration

        # Saved even when no threshold meets the budget: the rates are what an admin needs then.
        source = _calibration_source(set_name, corpus, questions, ood, from_log)
        record = cal.to_record(result, source=source, at=time.time())
        save_calibration(store or _store(settings), record)
        if not as_json:
            click.echo("Saved this calibration to the knowledge base; App Home shows it.")
    if result.proposed is None:
        ctx.exit(1)


def _calibration_source(
    set_name: str | None,
    corpus: Path | None,
    questions: Path | None,
    ood: Path | None,
    from_log: Path | None,
) -> str:
    """What a calibration measured, for a person: ``set pip-black``, ``log labelled.jsonl``."""
    from index.names import display_name

    if from_log is not None:
        return display_name(f"log {from_log.name}")
    given = (("corpus", corpus), ("questions", questions), ("ood", ood))
    own = ", ".join(f"{label} {path.parent.name}/{path.name}" for label, path in given if path)
    if all(path for _, path in given):
        return display_name(own)
    base = f"set {set_name or DEFAULT_SET}"
    return display_name(f"{base} with {own}" if own else base)


def _store(settings: Settings) -> Store:
    """The configured knowledge base's store (the query log and meta only: no model loaded)."""
    from index.storage import Store

    return Store(settings.data_dir)
