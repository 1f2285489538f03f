"""The options of the `raftlog` data source, validated once, with errors naming the option.

Offsets follow Spark's Kafka source: `earliest`, `latest`, or JSON per partition such as
`{"0": 120, "1": -2}` where a number is the next log index to read (a start is inclusive, an end
exclusive), -2 means earliest and -1 latest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

EARLIEST = -2
LATEST = -1

Mode = Literal["log", "table"]
# A position per partition: the next index to read, or EARLIEST / LATEST.
OffsetSpec = Literal["earliest", "latest"] | dict[int, int]
# A time (ms since the epoch) for every partition, or per partition.
TimeSpec = int | dict[int, int]


class OptionError(ValueError):
    """A bad option: the message names the option and the reason."""

    def __init__(self, option: str, reason: str) -> None:
        self.option = option
        self.reason = reason
        super().__init__(f"raftlog option {option!r}: {reason}")


_TRUE = {"true", "1", "yes"}
_FALSE = {"false", "0", "no"}
# The documented spelling of each option (the README's table lists the same).
_DOC = (
    "endpoints",
    "partitions",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy",
    "endingTimestamp",
    "endingOffsetsByTimestamp",
    "mode",
    "preferFollowers",
    "token",
    "tokenFile",
    "caFile",
    "maxRecordsPerSplit",
    "minPartitions",
    "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger",
    "maxTriggerDelay",
    "failOnDataLoss",
    "includeHeaders",
    "retentionHold",
    "retentionHoldTtlSeconds",
    "timeoutSeconds",
    "pageRecords",
    "archiveUrl",
    "archiveEndpoint",
    "archiveRegion",
    "archiveCredentialsFile",
    "archiveAccessKeyId",
    "archiveSecretAccessKey",
)
READ_OPTIONS = _DOC
KNOWN = {name.lower() for name in _DOC} | {"path"}  # Spark passes load(path) as "path"


@dataclass(frozen=True)
class ArchiveOptions:
    """Where the cluster's continuous archive is (`raftlog.spark.archived` reads it)."""

    url: str  # s3://bucket/prefix, as the nodes' archive_url
    bucket: str
    prefix: str  # "" for the bucket's root
    endpoint: str | None  # http(s) URL of the S3 API; None: AWS S3
    region: str | None
    access_key_id: str | None  # None: the executors' own AWS credentials chain
    secret_access_key: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Options:
    endpoints: tuple[str, ...]
    partitions: tuple[int, ...] | None  # None: all of them
    starting: OffsetSpec
    ending: OffsetSpec
    # Start (end) at the first record stamped at or after a time; None: by offsets.
    starting_times: TimeSpec | None
    ending_times: TimeSpec | None
    no_match_latest: bool  # a start time no record reaches: latest (else an error)
    mode: Mode
    prefer_followers: bool
    token: str | None
    ca_file: str | None
    max_records_per_split: int
    min_partitions: int | None  # at least this many Spark partitions (splits cut smaller)
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay_s: float  # a batch smaller than the minimum runs after this long
    fail_on_data_loss: bool
    include_headers: bool  # Kafka's headers type instead of a map of strings
    retention_hold: str | None  # the holder's name; None: no hold
    retention_hold_ttl_s: float
    timeout_s: float
    page_records: int
    archive: ArchiveOptions | None = None  # None: only the nodes are read


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    v = str(raw).strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise OptionError(name, f"must be true or false, got {raw!r}")


N = TypeVar("N", int, float)
D = TypeVar("D")  # the default: int | None for counts, float for seconds


def _bounded(
    opts: Mapping[str, str],
    name: str,
    default: D,
    lo: N,
    hi: N,
    parse: Callable[[str], N],
    what: str,
) -> N | D:
    """A number option within [lo, hi]; `parse` reads it and `what` names its kind in the error."""
    raw = opts.get(name.lower())
    if raw is None:
        return default
    try:
        v = parse(str(raw).strip())
    except ValueError:
        raise OptionError(name, f"must be {what}, got {raw!r}") from None
    if not lo <= v <= hi:
        raise OptionError(name, f"must be between {lo} and {hi}, got {v}")
    return v


_INTEGER = re.compile(r"[+-]?[0-9]+")


def integer(text: str) -> int:
    """An integer as the JVM reader's `Long.parseLong` reads one: ASCII digits with an optional
    sign, in 64 bits. Python's `int` also takes "1_0" (10), other scripts' digits and any size,
    which the JVM reader refused: the two readers read the same options alike."""
    text = text.strip()
    if not _INTEGER.fullmatch(text):
        raise ValueError(f"not an integer: {text!r}")
    value = int(text)
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"out of 64 bits: {text!r}")
    return value


def _int(opts: Mapping[str, str], name: str, default: int | None, lo: int, hi: int) -> int | None:
    return _bounded(opts, name, default, lo, hi, integer, "an integer")


_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def decimal(text: str) -> float:
    """A number in decimal notation, as both readers take one (not Python's "1_0" nor Java's
    "1d" or hexadecimal "0x1p3")."""
    text = text.strip()
    if not _DECIMAL.fullmatch(text):
        raise ValueError(f"not a decimal number: {text!r}")
    return float(text)


def _float(opts: Mapping[str, str], name: str, default: float, lo: float, hi: float) -> float:
    return _bounded(opts, name, default, lo, hi, decimal, "a number")


# Spark's time strings (JavaUtils.timeStringAsMs), as Kafka's maxTriggerDelay takes them.
_DURATION = re.compile(r"^\s*(\d+)\s*(us|ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def _duration(opts: Mapping[str, str], name: str, default_s: float) -> float:
    raw = opts.get(name.lower())
    if raw is None:
        return default_s
    m = _DURATION.match(str(raw))
    if not m:
        raise OptionError(name, f"must be a duration such as 30s, 15m or 1h, got {raw!r}")
    return int(m.group(1)) * _UNIT_S[(m.group(2) or "ms").lower()]


def _per_partition(name: str, text: str, like: str, what: str) -> dict[int, Any]:
    """A non-empty JSON object of partition -> value (`what`), keys checked; OptionError naming
    `name` otherwise (`like` is the example the message shows)."""
    try:
        parsed = json.loads(text)
    except ValueError as e:
        raise OptionError(name, f"must be {like}: {e}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(name, f"must be a non-empty JSON object of partition -> {what}")
    out: dict[int, Any] = {}
    for k, v in parsed.items():
        try:
            p = integer(k)
        except ValueError:
            raise OptionError(name, f"partition {k!r} is not an integer") from None
        if p < 0:
            raise OptionError(name, f"partition {p} is negative")
        out[p] = v
    return out


def parse_offsets(name: str, raw: str | None, default: OffsetSpec, *, ending: bool) -> OffsetSpec:
    """`earliest`, `latest` or a JSON object of partition -> index (-2 earliest, -1 latest)."""
    if raw is None:
        return default
    text = str(raw).strip()
    if text.lower() in ("earliest", "latest"):
        if ending and text.lower() == "earliest":
            raise OptionError(name, "an ending offset cannot be earliest (use latest or JSON)")
        return "earliest" if text.lower() == "earliest" else "latest"
    parsed = _per_partition(
        name, text, 'earliest, latest or a JSON object like {"0": 42}', 'index, like {"0": 42}'
    )
    out: dict[int, int] = {}
    for p, v in parsed.items():
        if not isinstance(v, int) or isinstance(v, bool):
            raise OptionError(name, f"the offset of partition {p} must be an integer, got {v!r}")
        if v < EARLIEST or v == 0:
            raise OptionError(
                name,
                f"the offset of partition {p} must be a log index >= 1, -2 (earliest) "
                f"or -1 (latest), got {v}",
            )
        if ending and v == EARLIEST:
            raise OptionError(name, f"the ending offset of partition {p} cannot be -2 (earliest)")
        out[p] = v
    return out


def _times(opts: Mapping[str, str], one: str, per: str, offsets: str) -> TimeSpec | None:
    """`one` (a time for every partition) or `per` (JSON partition -> time), never with each
    other nor with `offsets`."""
    given = [name for name in (offsets, per, one) if name.lower() in opts]
    if len(given) > 1:
        raise OptionError(given[-1], f"give one of {', '.join(given)}, not both")
    if one.lower() in opts:
        raw = str(opts[one.lower()]).strip()
        try:
            value = integer(raw)  # "²" is a digit to str.isdigit, not to int
        except ValueError:
            value = -1
        if value < 0 or raw[:1] in "+-":
            raise OptionError(one, f"must be milliseconds since the epoch, got {raw!r}")
        return value
    if per.lower() not in opts:
        return None
    parsed = _per_partition(
        per, str(opts[per.lower()]), 'a JSON object like {"0": 1700000000000}', "time in ms"
    )
    out: dict[int, int] = {}
    for p, v in parsed.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise OptionError(
                per, f"the time of partition {p} must be milliseconds since the epoch, got {v!r}"
            )
        out[p] = v
    return out


_ARCHIVE = ("archiveEndpoint", "archiveRegion", "archiveCredentialsFile", "archiveAccessKeyId",
            "archiveSecretAccessKey")  # fmt: skip


def _credentials_file(raw: str) -> tuple[str, str]:
    """The access key id and the secret from a file of two lines, or of JSON
    `{"access_key_id", "secret_access_key"}` (the nodes' archive_credentials_file, a mounted
    Secret). Errors name the option, never the secret."""
    name = "archiveCredentialsFile"
    try:
        text = Path(raw).read_text()
    except OSError as e:
        raise OptionError(name, f"{raw} cannot be read ({e.strerror})") from None
    key: Any = None
    secret: Any = None
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            raise OptionError(name, f"{raw} is not valid JSON") from None
        if isinstance(doc, dict):
            key, secret = doc.get("access_key_id"), doc.get("secret_access_key")
    else:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if len(lines) == 2:
            key, secret = lines
    if not isinstance(key, str) or not isinstance(secret, str) or not key or not secret:
        raise OptionError(
            name,
            f"{raw} must hold the access key id and the secret: two lines, or JSON "
            '{"access_key_id": ..., "secret_access_key": ...}',
        )
    return key, secret


def parse_archive(opts: Mapping[str, str], mode: str) -> ArchiveOptions | None:
    """The archive options (`opts` lower-cased), or None without archiveUrl."""
    raw_url = opts.get("archiveurl")
    if raw_url is None or not str(raw_url).strip():
        given = [name for name in _ARCHIVE if name.lower() in opts]
        if given:
            raise OptionError(given[0], "set, but archiveUrl is not (the archive is not read)")
        return None
    url = str(raw_url).strip()
    u = urlsplit(url)
    if u.scheme != "s3" or not u.netloc or u.query or u.fragment:
        raise OptionError("archiveUrl", f"must be s3://bucket/prefix, got {url!r}")
    if mode == "table":
        raise OptionError(
            "archiveUrl",
            "is for mode=log (a table is read from a replica's snapshot and the log after it)",
        )
    prefix = u.path.strip("/")
    endpoint = opts.get("archiveendpoint")
    if endpoint is not None:
        endpoint = str(endpoint).strip().rstrip("/")
        e = urlsplit(endpoint)
        if e.scheme not in ("http", "https") or not e.netloc or e.path or e.query:
            raise OptionError(
                "archiveEndpoint",
                f"must be an http(s) URL such as http://host:9000, got {endpoint!r}",
            )
    region = opts.get("archiveregion")
    if region is not None and not str(region).strip():
        raise OptionError("archiveRegion", "is empty (leave it out for the default, us-east-1)")
    key = opts.get("archiveaccesskeyid")
    secret = opts.get("archivesecretaccesskey")
    creds_file = opts.get("archivecredentialsfile")
    if creds_file is not None and (key is not None or secret is not None):
        name = "archiveAccessKeyId" if key is not None else "archiveSecretAccessKey"
        raise OptionError(name, "give archiveCredentialsFile or the keys, not both")
    if (key is None) != (secret is None):
        missing = "archiveSecretAccessKey" if secret is None else "archiveAccessKeyId"
        raise OptionError(missing, "is required with the other key (give both, or neither)")
    if key is not None and (not str(key).strip() or not str(secret).strip()):
        raise OptionError("archiveAccessKeyId" if not str(key).strip() else
                          "archiveSecretAccessKey", "is empty")  # fmt: skip
    if creds_file is not None:
        key, secret = _credentials_file(str(creds_file))
    return ArchiveOptions(
        url=f"s3://{u.netloc}/{prefix}".rstrip("/"),
        bucket=u.netloc,
        prefix=prefix,
        endpoint=endpoint or None,
        region=str(region).strip() if region is not None else None,
        access_key_id=str(key).strip() if key is not None else None,
        secret_access_key=str(secret).strip() if secret is not None else None,
    )


def parse(raw_options: Mapping[str, str], *, streaming: bool) -> Options:
    """Every option validated; OptionError names the first bad one."""
    opts = {str(k).lower(): v for k, v in raw_options.items()}
    if "maxrecordspertrigger" in opts:
        raise OptionError(
            "maxRecordsPerTrigger", "is spelt maxOffsetsPerTrigger (the name of Kafka's source)"
        )
    unknown = sorted(set(opts) - KNOWN)
    if unknown:
        raise OptionError(unknown[0], f"unknown option (known: {', '.join(sorted(_DOC))})")
    if opts.get("path"):
        raise OptionError("path", "the raftlog source takes no path; give option('endpoints', ...)")
    raw_endpoints = str(opts.get("endpoints") or "").strip()
    if not raw_endpoints:
        raise OptionError("endpoints", "is required: comma-separated node URLs (http://host:port)")
    # Each once: a replica named twice was counted twice, and "every replica compacted it"
    # (data loss) was never met, so the read waited out timeoutSeconds instead.
    endpoints = tuple(
        dict.fromkeys(e.strip().rstrip("/") for e in raw_endpoints.split(",") if e.strip())
    )
    for e in endpoints:
        if not e.startswith(("http://", "https://")):
            raise OptionError("endpoints", f"{e!r} is not an http(s) URL")
    partitions: tuple[int, ...] | None = None
    raw_parts = opts.get("partitions")
    if raw_parts is not None and str(raw_parts).strip():
        try:
            partitions = tuple(sorted({integer(p) for p in str(raw_parts).split(",") if p.strip()}))
        except ValueError:
            raise OptionError(
                "partitions", f"must be comma-separated partition numbers, got {raw_parts!r}"
            ) from None
        if not partitions or partitions[0] < 0:
            raise OptionError(
                "partitions", f"must be non-negative partition numbers: {raw_parts!r}"
            )
    mode = str(opts.get("mode", "log")).strip().lower()
    if mode not in ("log", "table"):
        raise OptionError("mode", f"must be log or table, got {opts.get('mode')!r}")
    if mode == "table" and streaming:
        raise OptionError("mode", "table is a batch read; a stream reads the log (mode=log)")
    starting = parse_offsets(
        "startingOffsets",
        opts.get("startingoffsets"),
        "latest" if streaming else "earliest",
        ending=False,
    )
    if streaming and "endingoffsets" in opts:
        raise OptionError("endingOffsets", "is for batch reads; a stream has no end")
    ending = parse_offsets("endingOffsets", opts.get("endingoffsets"), "latest", ending=True)
    starting_times = _times(
        opts, "startingTimestamp", "startingOffsetsByTimestamp", "startingOffsets"
    )
    ending_times = _times(opts, "endingTimestamp", "endingOffsetsByTimestamp", "endingOffsets")
    if streaming and ending_times is not None:
        name = "endingTimestamp" if "endingtimestamp" in opts else "endingOffsetsByTimestamp"
        raise OptionError(name, "is for batch reads; a stream has no end")
    strategy = str(opts.get("startingoffsetsbytimestampstrategy", "error")).strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError(
            "startingOffsetsByTimestampStrategy", f"must be error or latest, got {strategy!r}"
        )
    include_headers = _bool(opts, "includeHeaders", False)
    if include_headers and mode == "table":
        raise OptionError("includeHeaders", "is for mode=log (a table's rows have no headers)")
    if mode == "table":
        for name in ("startingTimestamp", "startingOffsetsByTimestamp", "endingTimestamp",
                     "endingOffsetsByTimestamp"):  # fmt: skip
            if name.lower() in opts:
                raise OptionError(name, "mode=table reads the table as of latest")
        if starting != "earliest":
            raise OptionError("startingOffsets", "mode=table reads the whole table: leave it out")
        if ending != "latest":
            raise OptionError("endingOffsets", "mode=table reads the table as of latest")
    token = opts.get("token")
    token_file = opts.get("tokenfile")
    if token and token_file:
        raise OptionError("tokenFile", "give token or tokenFile, not both")
    if token_file:
        try:
            token = Path(str(token_file)).read_text().strip()
        except OSError as e:
            raise OptionError("tokenFile", f"cannot be read: {e}") from None
        if not token:
            raise OptionError("tokenFile", f"{token_file} is empty")
    ca_file = opts.get("cafile")
    if ca_file and not Path(str(ca_file)).is_file():
        raise OptionError("caFile", f"{ca_file} is not a file")
    hold = opts.get("retentionhold")
    if hold is not None:
        hold = str(hold).strip()
        if not streaming:
            raise OptionError("retentionHold", "holds are for streams (a batch range is fixed)")
        # The node's rule (its storage/holds.py, which Spark does not import); a '/' would end
        # the name's path segment.
        if not 0 < len(hold) <= 200 or not hold.isprintable() or "/" in hold:
            raise OptionError(
                "retentionHold",
                "must be a holder name of 1 to 200 printable characters without '/'",
            )
    per_split = _int(opts, "maxRecordsPerSplit", 200_000, 1, 2**40)
    assert per_split is not None
    page = _int(opts, "pageRecords", 20_000, 1, 50_000)
    assert page is not None
    per_trigger = _int(opts, "maxOffsetsPerTrigger", None, 1, 2**40)
    min_per_trigger = _int(opts, "minOffsetsPerTrigger", None, 1, 2**40)
    for name in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"):
        if name.lower() in opts and not streaming:
            raise OptionError(name, "is for streams (readStream)")
    if "maxtriggerdelay" in opts and min_per_trigger is None:
        raise OptionError("maxTriggerDelay", "bounds the wait of minOffsetsPerTrigger: set both")
    if per_trigger is not None and min_per_trigger is not None and min_per_trigger > per_trigger:
        raise OptionError(
            "minOffsetsPerTrigger",
            f"{min_per_trigger} is more than maxOffsetsPerTrigger ({per_trigger})",
        )
    min_partitions = _int(opts, "minPartitions", None, 1, 1_000_000)
    archive = parse_archive(opts, mode)
    return Options(
        endpoints=endpoints,
        partitions=partitions,
        starting=starting,
        ending=ending,
        starting_times=starting_times,
        ending_times=ending_times,
        no_match_latest=strategy == "latest",
        mode="table" if mode == "table" else "log",
        prefer_followers=_bool(opts, "preferFollowers", True),
        token=str(token) if token else None,
        ca_file=str(ca_file) if ca_file else None,
        max_records_per_split=per_split,
        min_partitions=min_partitions,
        max_offsets_per_trigger=per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_s=_duration(opts, "maxTriggerDelay", 15 * 60.0),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        include_headers=include_headers,
        retention_hold=hold or None,
        retention_hold_ttl_s=_float(opts, "retentionHoldTtlSeconds", 3600.0, 1.0, 30 * 86400.0),
        timeout_s=_float(opts, "timeoutSeconds", 30.0, 0.1, 3600.0),
        page_records=page,
        archive=archive,
    )
