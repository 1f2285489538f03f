"""Just enough PromQL to know what a dashboard's queries read: the series selected (metric name and
label matchers), the labels named in `by`/`without`/`on`/`ignoring`/`group_left`/`group_right`,
and which sample names of a Prometheus exposition belong to which metric family.

Not a full parser: it tokenizes an expression and walks the tokens, skipping strings, numbers,
durations, range and subquery brackets and Grafana variables, so that function and aggregation
names, keywords and label names are never taken for metric names. An unknown function name or a
token it does not understand is an error, not a silent skip.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

FUNCTIONS = frozenset(
    """abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time ceil changes
    clamp clamp_max clamp_min cos cosh count_over_time day_of_month day_of_week
    day_of_year days_in_month deg delta deriv double_exponential_smoothing end exp floor
    histogram_avg histogram_count histogram_fraction histogram_quantile histogram_stddev
    histogram_stdvar histogram_sum holt_winters hour idelta increase info irate label_join
    label_replace last_over_time ln log10 log2 mad_over_time max_over_time min_over_time
    minute month pi predict_linear present_over_time quantile_over_time rad rate resets
    round scalar sgn sin sinh sort sort_by_label sort_by_label_desc sort_desc sqrt start
    stddev_over_time stdvar_over_time sum_over_time tan tanh time timestamp vector year""".split()  # noqa: SIM905
)
AGGREGATIONS = frozenset(
    """sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk
    limit_ratio""".split()  # noqa: SIM905
)
# Followed by a parenthesized list of label names.
GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"})

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<var>\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*|\[\[[A-Za-z_][A-Za-z0-9_:]*\]\])
  | (?P<number>0[xX][0-9a-fA-F]+|(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?
        (?:(?:ms|s|m|h|d|w|y)(?:[0-9]+(?:ms|s|m|h|d|w|y))*)?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=,(){}\[\]@:])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class Token:
    kind: str
    text: str


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str  # =, !=, =~, !~
    value: str


@dataclass(frozen=True)
class Selector:
    metric: str
    matchers: tuple[Matcher, ...] = ()


@dataclass
class Query:
    selectors: list[Selector] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)

    @property
    def metrics(self) -> set[str]:
        return {s.metric for s in self.selectors}


def tokenize(expr: str) -> list[Token]:
    out: list[Token] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot read {expr[pos : pos + 20]!r} at {pos} of {expr!r}")
        kind = m.lastgroup
        assert kind is not None
        if kind != "ws":
            out.append(Token(kind, m.group()))
        pos = m.end()
    return out


def _unquote(text: str) -> str:
    if text[0] == "`":
        return text[1:-1]
    if text[0] == "'":
        text = '"' + text[1:-1].replace('\\"', '"').replace('"', '\\"') + '"'
    value = json.loads(text)
    assert isinstance(value, str)
    return value


def parse(expr: str) -> Query:
    """The selectors and grouping labels of one PromQL expression (Grafana variables allowed)."""
    tokens = tokenize(expr)
    query = Query()
    i = 0

    def at(j: int) -> str:
        return tokens[j].text if j < len(tokens) else ""

    def matchers(j: int) -> tuple[list[Matcher], int]:
        """The matchers of `{...}` opening at tokens[j]; the index after its `}`."""
        assert at(j) == "{"
        found: list[Matcher] = []
        j += 1
        while at(j) != "}":
            if j + 3 > len(tokens):
                raise ValueError(f"unclosed {{ in {expr!r}")
            label, op, value = tokens[j], tokens[j + 1], tokens[j + 2]
            if (
                label.kind != "ident"
                or op.text not in ("=", "!=", "=~", "!~")
                or value.kind != "string"
            ):
                raise ValueError(f"bad label matcher at token {j} of {expr!r}")
            found.append(Matcher(label.text, op.text, _unquote(value.text)))
            j += 3
            if at(j) == ",":
                j += 1
            elif at(j) == "":
                raise ValueError(f"unclosed {{ in {expr!r}")
            elif at(j) != "}":
                raise ValueError(f"expected , or }} after a matcher in {expr!r}")
        return found, j + 1

    while i < len(tokens):
        tok = tokens[i]
        if tok.text == "[":  # a range or subquery: durations and variables only
            close = next((j for j in range(i, len(tokens)) if tokens[j].text == "]"), None)
            if close is None:
                raise ValueError(f"unclosed [ in {expr!r}")
            i = close + 1
        elif tok.kind == "ident":
            word = tok.text.lower()
            if word in GROUPING:
                i += 1
                if at(i) == "(":
                    close = next(j for j in range(i, len(tokens)) if tokens[j].text == ")")
                    for t in tokens[i + 1 : close]:
                        if t.kind == "ident":
                            query.grouping.add(t.text)
                        elif t.text != ",":
                            raise ValueError(f"bad label list after {tok.text} in {expr!r}")
                    i = close + 1
            elif at(i + 1) == "(":
                if tok.text not in FUNCTIONS | AGGREGATIONS:
                    raise ValueError(f"unknown function {tok.text!r} in {expr!r}")
                i += 1
            elif word in KEYWORDS or (
                tok.text in AGGREGATIONS and at(i + 1).lower() in ("by", "without")
            ):
                i += 1  # an aggregation whose clause comes first: sum by (x) (...)
            else:
                found: list[Matcher] = []
                i += 1
                if at(i) == "{":
                    found, i = matchers(i)
                query.selectors.append(Selector(tok.text, tuple(found)))
        elif tok.text == "{":  # a selector without a name: {__name__="x", ...}
            found, i = matchers(i)
            names = [m.value for m in found if m.label == "__name__" and m.op == "="]
            if len(names) != 1:
                raise ValueError(f"a selector without one __name__= in {expr!r}")
            rest = tuple(m for m in found if m.label != "__name__")
            query.selectors.append(Selector(names[0], rest))
        else:
            i += 1
    return query


@dataclass
class Family:
    """One metric family of an exposition, with the labels and values its samples carried."""

    name: str
    type: str
    labels: dict[str, set[str]] = field(default_factory=dict)  # label -> values seen

    def series_names(self) -> tuple[str, ...]:
        """The sample names Prometheus stores for this family: a counter's `_total`; a
        histogram's `_bucket`, `_sum` and `_count`; a summary's quantiles, `_sum` and `_count`."""
        if self.type == "counter":
            return (f"{self.name}_total",)
        if self.type == "histogram":
            return tuple(f"{self.name}{s}" for s in ("_bucket", "_sum", "_count"))
        if self.type == "summary":
            return (self.name, f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


class Exposition:
    """The metric families of one or more `/metrics` texts, merged."""

    def __init__(self, texts: Iterable[str] = ()) -> None:
        self.families: dict[str, Family] = {}
        # series name -> label -> values, from the samples themselves
        self.samples: dict[str, dict[str, set[str]]] = {}
        for text in texts:
            self.add(text)

    def add(self, text: str) -> None:
        for f in text_string_to_metric_families(text):
            fam = self.families.setdefault(f.name, Family(f.name, f.type))
            assert fam.type == f.type, (f.name, fam.type, f.type)
            s: Sample
            for s in f.samples:
                seen = self.samples.setdefault(s.name, {})
                for k, v in s.labels.items():
                    seen.setdefault(k, set()).add(v)
                    fam.labels.setdefault(k, set()).add(v)

    def family_of(self, series: str) -> Family | None:
        """The family a series name used in a query belongs to: `x_bucket` of histogram `x`,
        `x_total` of counter `x`, gauge `x` itself; None when no family has it (a bare
        histogram or counter name, or a name this exposition does not have)."""
        for fam in self.families.values():
            if series in fam.series_names():
                return fam
        return None

    def labels_of(self, series: str) -> dict[str, set[str]]:
        """Label -> values seen on the samples of a series name (`le` included on buckets)."""
        return self.samples.get(series, {})
