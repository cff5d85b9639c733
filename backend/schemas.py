"""Request and response models of the HTTP API (pydantic): validation and the OpenAPI schemas."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, RootModel, ValidationError
from pydantic.json_schema import SkipJsonSchema

from backend import inputs
from backend.errors import BadRequest, PayloadTooLarge
from backend.inputs import MAX_INT, NOT_BLANK
from backend.settings import Settings
from modelformat.names import LABEL_PATTERN, MODEL_NAME_PATTERN

# A request body's ``model`` (OpenAI's and Cohere's requests name it there): 'name',
# 'name@version' or 'name:label', each part as the naming rules say (a version under 10^18).
MODEL_SPEC_PATTERN = MODEL_NAME_PATTERN[:-1] + rf"(@[0-9]{{1,18}}|:{LABEL_PATTERN[1:-1]})?$"
MODEL_SPEC = re.compile(MODEL_SPEC_PATTERN)
ModelSpec = Annotated[
    str, Field(min_length=1, max_length=128 + 1 + 128, pattern=MODEL_SPEC_PATTERN)
]


def _integral(value: Any) -> Any:
    """Accept a float with no fraction as an int (JSON Schema's ``integer`` includes 1.0)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_INT:
        return int(value)
    return value


# An integer as JSON Schema means it: 3 and 3.0, never "3" or true. (The bound goes before
# the validator: after it, pydantic writes "ge" into the JSON schema instead of "minimum".)
Int = Annotated[int, BeforeValidator(_integral)]
NonNegative = Annotated[int, Field(ge=0, le=MAX_INT), BeforeValidator(_integral)]
Positive = Annotated[int, Field(ge=1, le=MAX_INT), BeforeValidator(_integral)]
# A text the gateway takes: at least one character that isn't whitespace.
Text = Annotated[str, Field(min_length=1, pattern=NOT_BLANK)]


# "version" and "label" both set (not null) is refused: the schema says so too.
VERSION_OR_LABEL: dict[str, Any] = {
    "not": {
        "required": ["version", "label"],
        "properties": {"version": {"type": "integer"}, "label": {"type": "string"}},
    }
}


class _Inputs(BaseModel):
    # strict: "1" is not a number and 1 is not a bool; forbid: a misspelt field is an error.
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=VERSION_OR_LABEL)

    texts: list[Text] = Field(
        min_length=1,
        description="Texts to process (non-empty strings); limits: GATEWAY_MAX_TEXTS texts, "
        "GATEWAY_MAX_TEXT_CHARS characters each.",
    )
    version: NonNegative | None = Field(
        default=None, description="Serve with this exact model version."
    )
    label: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Serve with the version this label points at (e.g. stable, canary).",
    )


class _Request(_Inputs):
    truncate: bool = Field(
        default=True,
        description="Cut texts longer than the model's max_seq_len (reported per text); "
        "false makes such a text a 422 error.",
    )
    truncation_direction: Literal["right", "left"] | None = Field(
        default=None,
        description="Which end a cut keeps: 'right' cuts the end (keeps the start), 'left' "
        "cuts the start (keeps the end). Default: the model's tokenizer's truncation side "
        "(right unless its checkpoint's tokenizer_config said left).",
    )


# One input of a sentence-pair model: [text_a, text_b].
Pair = Annotated[list[Text], Field(min_length=2, max_length=2)]


# A classify body has 'texts' (single-text models) or 'pairs' (sentence-pair models), not both.
def _texts_or_pairs(schema: dict[str, Any]) -> None:
    """Say in the schema: 'texts' or 'pairs' (one of them, no null default), version or label."""
    schema.update(VERSION_OR_LABEL)
    schema["oneOf"] = [{"required": ["texts"]}, {"required": ["pairs"]}]
    for name in ("texts", "pairs"):
        schema["properties"][name].pop("default", None)


Speed = Annotated[float, Field(ge=0.0, le=1.0)]


class ClassifyRequest(_Request):
    """Body of POST /v1/models/{model}:classify: ``texts``, or ``pairs`` for sentence-pair
    models."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_texts_or_pairs)
    # None only when absent (parse_request refuses a null): not in the schema.
    texts: Annotated[list[Text], Field(min_length=1)] | SkipJsonSchema[None] = Field(  # type: ignore[assignment]
        default=None,
        description="Texts to classify (single-text models); limits: GATEWAY_MAX_TEXTS texts, "
        "GATEWAY_MAX_TEXT_CHARS characters each. Give 'texts' or 'pairs'.",
    )
    pairs: Annotated[list[Pair], Field(min_length=1)] | SkipJsonSchema[None] = Field(
        default=None,
        description="Sentence pairs [text_a, text_b] (sentence-pair models: cross-encoders, "
        "NLI), token_type_ids 1 on text_b; limits as 'texts', per segment. A pair over "
        "max_seq_len is cut longest-first (the longer segment shortened first) and reported "
        "as truncated; one whose text_a alone fills max_seq_len is a 422.",
    )
    return_scores: bool = Field(
        default=False,
        description="Also return 'scores': every label's score, in the model's label order.",
    )
    top_k: Int = Field(default=1, ge=1, le=1000, description="How many ranked labels to return.")
    return_logits: bool = Field(default=False, description="Also return the raw logits.")
    speed: Speed | Annotated[list[Speed], Field(min_length=1)] | None = Field(
        default=None,
        description="Early-exit models: how early a text may leave the model, 0 (the full "
        "model) to 1 (the first exit); one number for every text, or a list with one per text: "
        "a list's length must equal that of 'texts' (or 'pairs'), else the request is a 422. "
        "Default: GATEWAY_DEFAULT_SPEED, else the model's own default. Models without early "
        "exits ignore it and say so in 'notes'.",
    )


class TagRequest(_Inputs):
    """Body of POST /v1/models/{model}:tag (token-classification models)."""

    aggregation: Literal["none", "simple", "first", "max", "average"] = Field(
        default="simple",
        description="How tokens become entities, as transformers' token-classification "
        "pipeline's aggregation_strategy: 'none' every token with its own label; 'simple' "
        "adjacent tokens of one type grouped (a B- starts a new one), score the mean; "
        "'first' / 'max' / 'average' word pieces fused into words first (label of the first "
        "piece / of the most confident piece / argmax of the averaged scores), then grouped.",
    )
    long_text: Literal["window", "truncate"] = Field(
        default="window",
        description="'window': a text over max_seq_len is read in windows of max_seq_len "
        "tokens overlapping by a quarter, and the windows' entities merged (overlaps: the "
        "longer entity kept, as the pipeline does with stride); 'truncate': only its first "
        "max_seq_len tokens are tagged, reported as truncated.",
    )


OutputType = Literal["float", "int8", "uint8", "binary", "ubinary"]
OutputKind = Literal["dense", "sparse", "multivector"]
MAX_SPARSE_TOP_K = 262_144  # a vocabulary's ids at most
SparseTopK = Annotated[int, Field(ge=1, le=MAX_SPARSE_TOP_K), BeforeValidator(_integral)]
# BGE-M3's score weights [dense, sparse, colbert]
Weights = Annotated[
    list[Annotated[float, Field(ge=0.0, le=1e6)]], Field(min_length=3, max_length=3)
]
InputType = Literal["search_query", "search_document", "classification", "clustering"]
PromptName = Annotated[str, Field(min_length=1, max_length=256)]


# "prompt_name" and "input_type" both set (not null) is refused: the schema says so too.
PROMPT_OR_INPUT_TYPE: dict[str, Any] = {
    "allOf": [{"not": {
        "required": ["prompt_name", "input_type"],
        "properties": {"prompt_name": {"type": "string"}, "input_type": {"type": "string"}},
    }}]
}  # fmt: skip


# A prompt goes before a text: token ids take no prompt_name or input_type (a 422 otherwise),
# which the schema says too: an input whose items are ids or lists of ids has neither.
PROMPTS_NEED_TEXTS: list[dict[str, Any]] = [{"not": {
    "required": ["input", field],
    "properties": {
        "input": {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "array"}]}},
        field: {"type": "string"},
    },
}} for field in ("prompt_name", "input_type")]  # fmt: skip


def _openai_embeddings(schema: dict[str, Any]) -> None:
    """Say in the schema: prompt_name or input_type, not both, and neither with token ids."""
    schema["allOf"] = [*PROMPT_OR_INPUT_TYPE["allOf"], *PROMPTS_NEED_TEXTS]


def _prompt_or_input_type(schema: dict[str, Any]) -> None:
    """Say in the schema: version or label, prompt_name or input_type (not both of either)."""
    schema.update(VERSION_OR_LABEL)
    schema.update(PROMPT_OR_INPUT_TYPE)


class EmbedRequest(_Request):
    """Body of POST /v1/models/{model}:embed."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_prompt_or_input_type)
    normalize: bool | None = Field(
        default=None,
        description="L2-normalize each embedding. Default: a sentence-transformers model "
        "answers as SentenceTransformer.encode does (normalized if it has a Normalize module); "
        "other models normalize.",
    )
    prompt_name: PromptName | None = Field(
        default=None,
        description="The model's prompt (sentence-transformers' prompts, e.g. 'query') to put "
        "before each text; default: the model's default prompt, if it has one. 422 for a name "
        "the model lacks (the message lists its prompts).",
    )
    input_type: InputType | None = Field(
        default=None,
        description="Cohere's input type, mapped onto the model's prompts: search_query -> "
        "'query', search_document -> 'document' (else 'passage'), classification / clustering "
        "-> the prompt of that name; a model without it embeds the text as it is. Give "
        "prompt_name or input_type, not both.",
    )
    embedding_types: Annotated[list[OutputType], Field(min_length=1, max_length=5)] | None = Field(
        default=None,
        description="Cohere v2's embedding types: also answer 'embeddings_by_type' with the "
        "vectors as each type: 'float'; 'int8' / 'uint8' (unit vectors only: each component's "
        "[-1, 1] range in 256 steps, sentence-transformers' quantize_embeddings rule with "
        "that fixed range); 'binary' / 'ubinary' (the sign bits packed 8 to a value, first "
        "component highest; binary as int8 = byte - 128, ubinary as uint8). 'embeddings' is "
        "left out unless 'float' is listed.",
    )
    long_text: Literal["truncate", "chunk"] = Field(
        default="truncate",
        description="'chunk': a text over max_seq_len is split into windows overlapping by a "
        "quarter, on token boundaries, all embedded in the same upstream call; the windows' "
        "L2-normalized embeddings are averaged, weighted by their tokens, into one vector "
        "('windows' says how many per text). Sparse vectors of the windows merge by the max "
        "weight per token id; multi-vectors are the windows' rows concatenated in order (the "
        "overlapping tokens' rows appear once per window).",
    )
    outputs: Annotated[list[OutputKind], Field(min_length=1, max_length=3)] | None = Field(
        default=None,
        description="The output kinds to answer, any of the model's (GET /v1/models/{model} "
        "does not list them; a kind the model lacks is a 422 naming those it has): 'dense' "
        "('embeddings'), 'sparse' ('sparse': token ids and weights), 'multivector' "
        "('multivectors': one vector per kept token). Default: 'dense' where the model has it, "
        "else its one kind (a ColBERT model: multivector; a SPLADE model: sparse). All kinds "
        "come from one forward pass.",
    )
    is_query: bool | None = Field(
        default=None,
        description="The texts are queries (true) or documents (false, the default). A ColBERT "
        "model encodes each side with its own marker after [CLS] and its own length (queries "
        "padded with [MASK] expansions, as PyLate does); an inference-free SPLADE model answers "
        "queries from its IDF table without a model call. input_type search_query means true, "
        "any other input_type false; a contradicting is_query is a 422.",
    )
    top_k: SparseTopK | None = Field(
        default=None,
        description="Sparse: at most this many entries per text, the largest weights (a SPLADE "
        "model's own top-k is the most: over it is a 422). Default: all.",
    )
    min_weight: float | None = Field(
        default=None,
        ge=0.0,
        le=1e6,
        description="Sparse: leave out entries weighing less. Entries weighing 0 or less are "
        "never answered.",
    )
    return_tokens: bool = Field(
        default=False,
        description="Sparse: also answer 'tokens', {token: weight}, the vocabulary's token "
        "string of each id (Elasticsearch's sparse_vector and OpenSearch's rank_features "
        "form; WordPiece's ## kept; no two ids share a string).",
    )
    encoding_format: Literal["float", "base64"] = Field(
        default="float",
        description="How vectors are written: 'float', JSON numbers; 'base64' (OpenAI's "
        "encoding_format), base64 of their little-endian bytes (float32 4 bytes a component, "
        "int8/uint8/binary/ubinary one byte a value): each dense vector one string, each "
        "text's multi-vector one string of its rows × dim matrix, row after row (rows and "
        "multivector_dim give its shape): 5.3 characters a float32 component against about 12 "
        "as JSON numbers; int8 multi-vectors 1.3.",
    )


class TokenizeRequest(BaseModel):
    """Body of POST /v1/models/{model}:tokenize."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=VERSION_OR_LABEL)
    texts: list[Text] = Field(min_length=1, description="Texts to tokenize.")
    version: NonNegative | None = Field(default=None, description="Tokenize as this version.")
    label: str | None = Field(default=None, min_length=1, max_length=256)


class DetokenizeRequest(BaseModel):
    """Body of POST /v1/models/{model}:detokenize."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=VERSION_OR_LABEL)
    ids: list[list[NonNegative]] = Field(
        min_length=1,
        description="Token id lists, one per text (ids of the model's vocabulary); limits: "
        "GATEWAY_MAX_TEXTS lists, GATEWAY_MAX_TOKEN_IDS ids each.",
    )
    version: NonNegative | None = Field(
        default=None,
    )
    label: str | None = Field(default=None, min_length=1, max_length=256)


class EmbeddingsRequest(BaseModel):
    """Body of POST /v1/embeddings (OpenAI's request)."""

    # Other fields are ignored, as clients of other providers send their own.
    model_config = ConfigDict(extra="ignore", json_schema_extra=_openai_embeddings)

    input: (
        Text
        | Annotated[list[Text], Field(min_length=1)]
        | Annotated[
            list[Annotated[list[NonNegative], Field(min_length=1)]],
            Field(min_length=1),
        ]
        | Annotated[list[NonNegative], Field(min_length=1)]
    ) = Field(
        description="A text, a list of texts, a list of token ids (one input), or a list of "
        "lists of token ids. Token ids are WordPiece ids of the model's vocabulary, without "
        "[CLS]/[SEP] (the gateway adds them). Limits: GATEWAY_MAX_TEXTS inputs, "
        "GATEWAY_MAX_TEXT_CHARS characters per text, GATEWAY_MAX_TOKEN_IDS ids per input."
    )
    model: ModelSpec = Field(
        description="A served model: 'name', 'name@version' or 'name:label' (e.g. minilm, "
        "minilm@2, minilm:stable).",
    )
    encoding_format: Literal["float", "base64"] = Field(
        default="float", description="'base64': little-endian float32 bytes, base64-encoded."
    )
    dimensions: Positive | None = Field(
        default=None, description="Keep the first N dimensions, then L2-normalize again."
    )
    user: str | None = Field(default=None, max_length=1024, description="Accepted and ignored.")
    truncation_direction: Literal["right", "left"] | None = Field(
        default=None, description="Not OpenAI's: which end a cut keeps (as on :embed)."
    )
    prompt_name: PromptName | None = Field(
        default=None,
        description="Not OpenAI's: the model's prompt to put before each text (as on :embed).",
    )
    input_type: InputType | None = Field(
        default=None,
        description="Cohere's input type, mapped onto the model's prompts (as on :embed).",
    )
    embedding_type: OutputType = Field(
        default="float",
        description="Not OpenAI's: the embedding's type, as on :embed's embedding_types: "
        "'float', 'int8', 'uint8', 'binary', 'ubinary' (integers; with encoding_format base64 "
        "their bytes).",
    )


class CohereEmbedRequest(BaseModel):
    """Body of POST /v2/embed (Cohere v2's request; texts only)."""

    model_config = ConfigDict(extra="ignore")  # output_dimension, max_tokens, ...: ignored
    model: ModelSpec = Field(description="'name', 'name@version' or 'name:label'.")
    texts: list[Text] = Field(min_length=1, description="Texts to embed; limits as :embed's texts.")
    input_type: InputType | None = Field(
        default=None, description="Mapped onto the model's prompts, as on :embed."
    )
    embedding_types: Annotated[list[OutputType], Field(min_length=1, max_length=5)] | None = Field(
        default=None, description="The output types, as on :embed (default: float)."
    )
    truncate: Literal["NONE", "START", "END"] = Field(
        default="END",
        description="A text over max_seq_len: NONE is a 422, START cuts its start, END its end.",
    )


class Document(BaseModel):
    """A document given as an object (Cohere v1, Jina): its ``text`` is ranked."""

    model_config = ConfigDict(extra="ignore")
    text: Text


class RerankFields(BaseModel):
    """What every rerank request carries."""

    query: Text = Field(description="The query the documents are ranked against.")
    documents: list[Text | Document] = Field(
        min_length=1, description="Texts, or objects with a 'text', to rank."
    )
    top_n: Positive | None = Field(default=None, description="Return only the best N.")
    return_documents: bool = Field(default=False, description="Echo each document's text.")
    truncation_direction: Literal["right", "left"] | None = Field(
        default=None,
        description="Which end of a long query or document a cut keeps (default: the model's "
        "tokenizer's side).",
    )
    weights: Weights | None = Field(
        default=None,
        description="Not Cohere's: a model with dense, sparse and multi-vector outputs (BGE-M3) "
        "scores by FlagEmbedding's weighted sum [dense, sparse, colbert]: (w0 * dense + w1 * "
        "sparse + w2 * colbert) / (w0 + w1 + w2), dense the inner product of the unit vectors, "
        "sparse the lexical match (the shared ids' weights multiplied, summed), colbert MaxSim. "
        "Any other model: a 422. The weights' sum must be above 0.",
    )


class RerankRequest(RerankFields):
    """Body of POST /v1/rerank and /v2/rerank (Cohere's and Jina's request)."""

    model_config = ConfigDict(extra="ignore")  # rank_fields, max_tokens_per_doc, ...: ignored
    model: ModelSpec = Field(description="'name', 'name@version' or 'name:label'.")


class ModelRerankRequest(RerankFields):
    """Body of POST /v1/models/{model}:rerank."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=VERSION_OR_LABEL)
    version: NonNegative | None = Field(
        default=None,
    )
    label: str | None = Field(default=None, min_length=1, max_length=256)


class ModelRef(BaseModel):
    """The model version that served a response."""

    name: str
    version: int


class Scored(BaseModel):
    """One label with its probability."""

    label: str
    score: float


class Prediction(BaseModel):
    """One input's classification."""

    label: str = Field(description="The label with the highest score.")
    score: float = Field(
        description="Its score: the head's activation of the logits (softmax; sigmoid for "
        "multi-label and one-logit heads; the raw value for regression heads)."
    )
    top_k: list[Scored]
    truncated: bool
    labels: list[Scored] | None = Field(
        default=None,
        description="Sigmoid heads (multi-label, one-logit): every label whose score is at "
        "or over its threshold (model.json's thresholds, else 0.5), best first; may be empty.",
    )
    scores: list[Scored] | None = Field(
        default=None, description="return_scores: every label's score, in the model's order."
    )
    logits: list[float] | None = None
    exit_layer: int | None = Field(
        default=None,
        ge=1,
        description="Early-exit models only: how many encoder layers the text ran before it "
        "exited (the model's layer count = the full model).",
    )


class ClassifyResponse(BaseModel):
    """Answer of :classify, predictions in the order of the request's texts."""

    model: ModelRef
    predictions: list[Prediction]
    notes: list[str] | None = Field(
        default=None,
        description="What the gateway did differently from what was asked, e.g. a 'speed' "
        "ignored by a model without early exits.",
    )


class TagEntity(BaseModel):
    """One entity (or, with aggregation 'none', one token) found in a text."""

    entity: str = Field(description="Its type: the label without its B-/I- prefix (ORDER).")
    label: str = Field(
        description="The model's label: the token's (B-ORDER) with aggregation 'none', the "
        "group's type otherwise (the pipeline's entity / entity_group)."
    )
    score: float
    start: int = Field(ge=0, description="Character offset of its start in the text as sent.")
    end: int = Field(ge=0, description="Character offset of its end (exclusive).")
    text: str = Field(description="text[start:end] of the text as sent.")


class TagPrediction(BaseModel):
    """One text's entities, in order of their start."""

    entities: list[TagEntity]
    truncated: bool = Field(description="long_text=truncate cut the text.")
    windows: int = Field(ge=1, description="How many windows the text was read in.")


class TagResponse(BaseModel):
    """Answer of :tag, in the order of the request's texts."""

    model: ModelRef
    aggregation: str
    predictions: list[TagPrediction]


class EmbeddingsByType(BaseModel):
    """The embeddings as each type asked in embedding_types (Cohere v2's shape)."""

    float_: list[list[float]] | None = Field(default=None, alias="float")
    int8: list[list[Annotated[int, Field(ge=-128, le=127)]]] | None = None
    uint8: list[list[Annotated[int, Field(ge=0, le=255)]]] | None = None
    binary: list[list[Annotated[int, Field(ge=-128, le=127)]]] | None = None
    ubinary: list[list[Annotated[int, Field(ge=0, le=255)]]] | None = None


class Base64EmbeddingsByType(BaseModel):
    """encoding_format base64: each type's vectors, one base64 string each."""

    float_: list[str] | None = Field(default=None, alias="float")
    int8: list[str] | None = None
    uint8: list[str] | None = None
    binary: list[str] | None = None
    ubinary: list[str] | None = None


class CohereEmbedResponse(BaseModel):
    """Answer of POST /v2/embed (Cohere v2's shape: embeddings by type)."""

    id: str
    embeddings: EmbeddingsByType
    texts: list[str]
    response_type: Literal["embeddings_by_type"]
    meta: dict[str, Any]


class SparseEmbedding(BaseModel):
    """One text's sparse vector, largest weight first."""

    indices: list[int] = Field(description="Vocabulary ids (Qdrant's and Milvus' indices).")
    values: list[float] = Field(description="Each id's weight (> 0), in the same order.")
    tokens: dict[str, float] | None = Field(
        default=None, description="return_tokens: {token string: weight}, the same entries."
    )


class MultiVectorsByType(BaseModel):
    """One text's token vectors as each non-float type asked in embedding_types (with
    encoding_format base64: one string of the matrix's bytes each)."""

    int8: list[list[Annotated[int, Field(ge=-128, le=127)]]] | str | None = None
    uint8: list[list[Annotated[int, Field(ge=0, le=255)]]] | str | None = None
    binary: list[list[Annotated[int, Field(ge=-128, le=127)]]] | str | None = None
    ubinary: list[list[Annotated[int, Field(ge=0, le=255)]]] | str | None = None


class MultiVector(BaseModel):
    """One text's token vectors (ColBERT's, BGE-M3's colbert_vecs): unit rows, one per kept
    token (BGE-M3: every token but [CLS]; ColBERT documents: every token but punctuation;
    ColBERT queries: every position, [MASK] expansions included)."""

    rows: int = Field(ge=0, description="How many vectors (tokens) the text has.")
    vectors: list[list[float]] | str | None = Field(
        default=None,
        description="float32 rows (encoding_format base64: one string of the [rows, dim] "
        "matrix's little-endian float32 bytes); left out when embedding_types lacks 'float'.",
    )
    vectors_by_type: MultiVectorsByType | None = Field(
        default=None, description="embedding_types: the rows as each other type asked."
    )


class TeiSparseRequest(BaseModel):
    """Body of POST /embed_sparse (text-embeddings-inference's request; the gateway's default
    model)."""

    model_config = ConfigDict(extra="ignore", strict=True)  # TEI's other fields: ignored
    inputs: Text | Annotated[list[Text], Field(min_length=1)] = Field(
        description="A text or a list of texts; limits as :embed's texts (token ids are not "
        "taken here)."
    )
    truncate: bool | None = Field(
        default=None,
        description="Cut texts over max_seq_len (reported nowhere: TEI's answer has no room); "
        "false: such a text is a 422; null: cut (TEI's --auto-truncate on).",
    )
    truncation_direction: Literal["right", "left", "Right", "Left"] = Field(
        default="right", description="Which end a cut keeps, as on :embed."
    )
    prompt_name: PromptName | None = Field(
        default=None, description="The model's prompt before each text, as on :embed."
    )


class TeiSparseValue(BaseModel):
    """One entry of a TEI sparse vector."""

    index: int
    value: float


class TeiSparseResponse(RootModel[list[list[TeiSparseValue]]]):
    """Answer of POST /embed_sparse (TEI's shape): per input its non-zero entries, by index."""


class EmbedResponse(BaseModel):
    """Answer of :embed, embeddings in the order of the request's texts."""

    model: ModelRef
    embeddings: list[list[float]] | list[str] | None = Field(
        default=None,
        description="float32 vectors (encoding_format base64: each a string of its "
        "little-endian bytes); left out when embedding_types lacks 'float'.",
    )
    embeddings_by_type: EmbeddingsByType | Base64EmbeddingsByType | None = Field(
        default=None, description="embedding_types: the vectors as each type asked."
    )
    dim: int | None = Field(
        default=None,
        description="Dimensions of the dense float vectors (binary: ceil(dim / 8) values); "
        "absent when no dense vectors are answered.",
    )
    truncated: list[bool]
    windows: list[int] | None = Field(
        default=None, description="long_text=chunk: how many windows each text was split into."
    )
    sparse: list[SparseEmbedding] | None = Field(
        default=None, description="outputs has 'sparse': each text's sparse vector."
    )
    multivectors: list[MultiVector] | None = Field(
        default=None, description="outputs has 'multivector': each text's token vectors."
    )
    multivector_dim: int | None = Field(
        default=None, description="Dimensions of each multi-vector row (float)."
    )


class VersionState(BaseModel):
    """One version's state on the model server."""

    version: int
    state: str
    error_code: str
    error_message: str


class EmbeddingData(BaseModel):
    """One input's embedding (OpenAI's shape)."""

    object: Literal["embedding"]
    index: int
    embedding: list[float] | list[int] | str = Field(
        description="Floats (integers for embedding_type int8, uint8, binary, ubinary), or "
        "base64 of their little-endian bytes (float32, or one byte each)."
    )


class Usage(BaseModel):
    """Tokens the model read ([CLS] and [SEP] included)."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    """Answer of POST /v1/embeddings (OpenAI's shape); ``model`` is name@served-version."""

    object: Literal["list"]
    data: list[EmbeddingData]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    """One served model (OpenAI's shape)."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(BaseModel):
    """Answer of GET /v1/models."""

    object: Literal["list"]
    data: list[ModelCard]


class RankedDocument(BaseModel):
    """One document's place: its index in the request, its score, its text if asked."""

    index: int
    relevance_score: float = Field(
        description="Embedding models: (1 + cosine) / 2, in [0, 1]. Multi-vector models "
        "(ColBERT, BGE-M3): MaxSim, the sum (ColBERT) or mean (BGE-M3) over the query's token "
        "vectors of each one's best dot product with the document's (not within [0, 1]); with "
        "'weights' (BGE-M3), the weighted sum of dense, sparse and MaxSim scores. Sparse-only "
        "models (SPLADE): the dot product of the sparse vectors. Cross-encoders (sentence-"
        "pair models): the head's score of (query, document): one logit: its sigmoid (the raw "
        "value for a regression head); several labels: the positive label's probability."
    )
    document: Document | None = None


class RerankResponse(BaseModel):
    """Answer of POST /v1/rerank and /v2/rerank (Cohere's and Jina's shape), best first."""

    id: str
    results: list[RankedDocument]
    model: str
    usage: dict[str, int]
    meta: dict[str, Any]


class ModelRerankResponse(BaseModel):
    """Answer of POST /v1/models/{model}:rerank, best first."""

    model: ModelRef
    results: list[RankedDocument]
    tokens: int


class TextTokens(BaseModel):
    """One text's tokens as the model gets them."""

    ids: list[int]
    tokens: list[str]
    offsets: list[list[int]] = Field(description="[start, end) character offsets in the text.")
    special: list[bool]
    truncated: bool
    length: int


class TokenizeResponse(BaseModel):
    """Answer of POST /v1/models/{model}:tokenize."""

    model: ModelRef
    max_seq_len: int
    tokens: list[TextTokens]


class DetokenizedText(BaseModel):
    """The text of one id list and its word pieces."""

    text: str
    tokens: list[str]


class DetokenizeResponse(BaseModel):
    """Answer of POST /v1/models/{model}:detokenize."""

    model: ModelRef
    texts: list[DetokenizedText]


class OpenAIErrorDetail(BaseModel):
    """OpenAI's error fields."""

    message: str
    type: str
    param: str | None
    code: str


class OpenAIErrorResponse(BaseModel):
    """Errors of /v1/embeddings and /v1/models (OpenAI's shape)."""

    error: OpenAIErrorDetail


class CohereErrorResponse(BaseModel):
    """Errors of /v1/rerank, /v2/rerank and /v2/embed (Cohere's shape)."""

    message: str
    code: str


class TeiErrorResponse(BaseModel):
    """Errors of /embed_sparse (text-embeddings-inference's shape)."""

    error: str
    error_type: str


class ModelStatusResponse(BaseModel):
    """Answer of GET /v1/models/{model}."""

    model: str
    versions: list[VersionState]
    labels: dict[str, int]
    default_version: int | None


class Health(BaseModel):
    """Answer of /healthz and /readyz."""

    status: str
    model: str | None = None
    version: int | None = None


class ErrorDetail(BaseModel):
    """What went wrong: a stable code and a human message."""

    code: str
    message: str


class ErrorResponse(BaseModel):
    """Every error response."""

    error: ErrorDetail


ModelT = TypeVar("ModelT", bound=BaseModel)

# Every list (and text) of every request, by the field that holds it: each goes through the one
# rule (backend/inputs.py) before pydantic sees the body. True: the field is required.
_TEXTS: dict[str, tuple[inputs.Checker, bool]] = {"texts": (inputs.texts_field, True)}
_RERANK: dict[str, tuple[inputs.Checker, bool]] = {
    "query": (inputs.query_field, True), "documents": (inputs.documents_field, True),
    "weights": (inputs.weights_field, False),
}  # fmt: skip
_EMBEDDING_TYPES: dict[str, tuple[inputs.Checker, bool]] = {
    "embedding_types": (inputs.embedding_types_field, False)
}
LISTS: dict[type[BaseModel], dict[str, tuple[inputs.Checker, bool]]] = {
    ClassifyRequest: {},  # texts or pairs (and speed): _check_classify
    EmbedRequest: {**_TEXTS, **_EMBEDDING_TYPES, "outputs": (inputs.outputs_field, False)},
    TagRequest: _TEXTS,
    TokenizeRequest: _TEXTS,
    DetokenizeRequest: {"ids": (inputs.ids_field, True)},
    EmbeddingsRequest: {"input": (inputs.openai_input, True)},
    CohereEmbedRequest: {**_TEXTS, **_EMBEDDING_TYPES},
    RerankRequest: _RERANK,
    ModelRerankRequest: _RERANK,
    TeiSparseRequest: {"inputs": (inputs.text_or_texts, True)},
}
_NOUNS = {"texts": "a list of strings", "ids": "a list of lists of token ids",
          "input": "a text or a list of texts or token ids", "query": "a text",
          "documents": "a list of texts", "inputs": "a text or a list of texts"}  # fmt: skip


def parse_request(kind: type[ModelT], raw: bytes, settings: Settings) -> ModelT:
    """Return the validated request in ``raw``; 400 / 413 / 422 errors name the field and limit
    (the first bad item of a list: ``texts[3]``), every list counted and read by the one rule
    before pydantic sees the body (a bad body costs what its first bad item costs to find)."""
    body, whole = inputs.load_bounded(raw, inputs.value_limit(settings))
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    check_fields(kind, body)
    limits = inputs.Limits(settings, whole)
    if kind is ClassifyRequest:
        _check_classify(body, limits)
    for field, (check, required) in LISTS[kind].items():
        if field in body:
            check(body[field], field, limits)
        elif whole and required:  # a cut body's may be past the cut: the lists read are
            # checked first, so its 4xx names the first bad item or the list over its limit
            raise BadRequest(f"field '{field}' is required: {_NOUNS[field]}")
    if not whole:  # every list read was within its limits: the values are in the others
        raise PayloadTooLarge(inputs.values_message(settings))
    try:
        request = kind.model_validate(body)
    except ValidationError as exc:
        raise BadRequest(first_error(exc)) from None
    if getattr(request, "version", None) is not None and getattr(request, "label", None):
        raise BadRequest("give 'version' or 'label', not both")
    if getattr(request, "prompt_name", None) is not None and getattr(request, "input_type", None):
        raise BadRequest("give 'prompt_name' or 'input_type', not both")
    return request


def _check_classify(body: dict[str, Any], limits: inputs.Limits) -> None:
    """A classify body's 'texts' or 'pairs' (one of them), then its 'speed' (one per input)."""
    if "pairs" in body:
        if "texts" in body:
            raise BadRequest("give 'texts' or 'pairs', not both")
        inputs.pairs_field(body["pairs"], "pairs", limits)
        count = len(body["pairs"])
    elif "texts" in body:
        inputs.texts_field(body["texts"], "texts", limits)
        count = len(body["texts"])
    else:
        raise BadRequest("field 'texts' is required: a list of strings (or 'pairs')")
    inputs.speed_field(body.get("speed"), "speed", limits, count)


def check_fields(kind: type[BaseModel], body: dict[str, Any]) -> None:
    """400 naming the first field a strict model (extra="forbid") lacks, before validation:
    pydantic would make one error per unknown field (100k of them fit in a body)."""
    if kind.model_config.get("extra") != "forbid":
        return
    for key in body:
        if key not in kind.model_fields:
            raise BadRequest(f"unknown field '{key}'")


def first_error(exc: ValidationError) -> str:
    """Return the first validation error as 'field: message'."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "body"
    if error["type"] == "extra_forbidden":
        return f"unknown field '{where}'"
    return f"field '{where}': {error['msg']}"
