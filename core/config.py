"""What the answer engine needs to know: the gate, the model endpoint, the links.

Built at the entry point from the product's one settings object
(``bot.settings.Settings.engine_config``); tests and tools build it directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_TOP_K = 4
# Questions of one person answered at a time: a question and a follow-up in
# another thread or surface go together, a flood waits behind its own first ones.
DEFAULT_MAX_QUESTIONS_PER_ASKER = 3
# Set from the bundled evaluation set (studies/2026-11-29-shipped-threshold.md,
# docs/evaluation.md "Thresholds per model"): the largest
# threshold whose bluff rate on its out-of-domain questions is at most 10 %.
# A threshold does not transfer between corpora: operators recalibrate with
# `kb calibrate` on their own documents.
DEFAULT_THRESHOLD = 0.475
# Between the threshold and this looser one the engine shows the closest
# passages as possibly related, without calling the model. Set from the
# evaluation sets (studies/2026-12-01-related-and-kept-passages.md): the smallest
# value refusing at most 5 %
# of in-domain questions outright. At or below DEFAULT_THRESHOLD it is off.
DEFAULT_RELATED_THRESHOLD = 0.6
# When several passing passages are about as close as the best, the right one
# is often ranked just past top_k: keep up to DEFAULT_MAX_KEPT of those within
# DEFAULT_KEEP_MARGIN of the best distance.
DEFAULT_MAX_KEPT = 8
DEFAULT_KEEP_MARGIN = 0.05
# Once the gate has passed a question, its candidates are re-ordered with their
# best sentence's similarity as a third fused leg of this weight (beside dense
# 1.0 and BM25 0.5). Chosen on pip-black, confirmed on prometheus
# (studies/2026-12-01-sentence-vectors.md); 0 turns it off.
DEFAULT_SENTENCE_WEIGHT = 0.5
# And with the share of the question's terms each holds together
# (core.proximity), a fourth leg of this weight: of the weights measured on
# both sets, the one no query loses by on either
# (studies/2026-12-02-term-proximity.md); 0 turns it off.
DEFAULT_PROXIMITY_WEIGHT = 0.2
# The weight of the candidates' latent terms (index.embed.latent) in that order, for a
# model with a sparse head (the multilingual preset; no other model has one).
# Measured on both multilingual sets, 0.1-0.75 (studies/2026-12-04-latent-terms.md).
DEFAULT_LATENT_WEIGHT = 0.3
DEFAULT_LINK_BASE_URL = "http://localhost:3000"
DEFAULT_LINK_TTL_DAYS = 90
DEFAULT_FIRST_TOKEN_TIMEOUT = 20.0
DEFAULT_LLM_DEADLINE = 60.0


@dataclass(frozen=True)
class LLMConfig:
    """An OpenAI-compatible endpoint; an empty ``base_url`` means no model (evidence only)."""

    base_url: str = ""
    # Never in a repr: a repr ends up in tracebacks and logs.
    api_key: str = field(default="", repr=False)
    model: str = "gpt-4o-mini"
    timeout: float = 30.0
    max_retries: int = 1
    # A model that trickles one token every few seconds never trips the
    # per-request timeout: these bound what the asker actually waits.
    first_token_timeout: float = DEFAULT_FIRST_TOKEN_TIMEOUT
    deadline: float = DEFAULT_LLM_DEADLINE


@dataclass(frozen=True)
class EngineConfig:
    """The refusal gate, the model, and the citation links.

    Attributes:
        top_k: most passages kept for one answer.
        threshold: cosine distance above which a passage is never used for an answer.
        related_threshold: below it (and above ``threshold``) the closest passages
            are shown as possibly related, without the model; at or below
            ``threshold``: never.
        thresholds_model: the embedding model the two thresholds were calibrated
            for ("": none), shown with them (``core.thresholds``).
        thresholds_origin: where they come from, for a person.
        max_kept: most passages kept for one answer when more than ``top_k`` are close.
        keep_margin: a passage after the first ``top_k`` is kept only within this
            distance of the best one.
        sentence_weight: weight of the candidates' best-sentence similarity in
            their order once the gate has passed (``core.retrieve.sentence_order``); 0: off.
        proximity_weight: weight of the share of the question's terms each
            candidate holds together, in that order (``core.proximity``); 0: off.
        latent_weight: weight of the candidates' latent terms' similarity to the
            question's, in that order (``index.embed.latent``), with a model that
            has a sparse head; 0: off.
        reranker: a CrossEncoder name or local folder that orders the passages
            that passed the gate; empty: fused order.
        link_base_url: where citation links point (no trailing slash).
        link_secret: signs citation links; empty: a secret kept in the data dir.
        link_ttl_days: how long a citation link stays valid.
        llm: the model endpoint.
        max_questions_per_asker: questions of one asker answered at a time; their
            further ones wait behind these (``core.lines``), nobody else's do.
    """

    top_k: int = DEFAULT_TOP_K
    threshold: float = DEFAULT_THRESHOLD
    related_threshold: float = DEFAULT_RELATED_THRESHOLD
    thresholds_model: str = ""
    thresholds_origin: str = ""
    max_kept: int = DEFAULT_MAX_KEPT
    keep_margin: float = DEFAULT_KEEP_MARGIN
    sentence_weight: float = DEFAULT_SENTENCE_WEIGHT
    proximity_weight: float = DEFAULT_PROXIMITY_WEIGHT
    latent_weight: float = DEFAULT_LATENT_WEIGHT
    reranker: str = ""
    link_base_url: str = DEFAULT_LINK_BASE_URL
    link_secret: str = field(default="", repr=False)
    link_ttl_days: int = DEFAULT_LINK_TTL_DAYS
    llm: LLMConfig = field(default_factory=LLMConfig)
    max_questions_per_asker: int = DEFAULT_MAX_QUESTIONS_PER_ASKER
