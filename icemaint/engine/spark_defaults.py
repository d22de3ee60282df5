"""The deployment's own `spark-defaults.conf`, as spark-submit reads it, so the session keeps what it says.

spark-submit applies the file's settings only where its command line names none, and every builder setting of
the session becomes such a command-line setting. A deployment whose file sets the driver's Java options (a
Kerberos configuration, an agent, GC flags), its jars or its SQL extensions lost them as soon as the session
added its own to the same key (measured: `-Dfoo.bar=1` from the file was gone from the driver's system
properties). `deployment_defaults` reads the file; `spark_session.session_conf` starts those keys from it.

The file is found as spark-submit finds it: `$SPARK_CONF_DIR/spark-defaults.conf`, else
`$SPARK_HOME/conf/spark-defaults.conf` (the SPARK_HOME pyspark starts the JVM from). Its format is a Java
properties file, which is what `java.util.Properties.load` accepts; spark-submit trims each value.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULTS_FILE = "spark-defaults.conf"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _properties_file(submit_args: str) -> str | None:
    """The `--properties-file` of pyspark's arguments to spark-submit (PYSPARK_SUBMIT_ARGS), if any."""
    import shlex

    try:
        words = shlex.split(submit_args)
    except ValueError:
        return None
    for i, word in enumerate(words):
        if word == "--properties-file" and i + 1 < len(words):
            return words[i + 1]
        if word.startswith("--properties-file="):
            return word.split("=", 1)[1]
    return None


def defaults_path(environ: dict[str, str] | None = None) -> Path | None:
    """Where spark-submit would read its defaults from (a `--properties-file` in PYSPARK_SUBMIT_ARGS replaces
    spark-defaults.conf), when that file exists and can be looked at."""
    env = os.environ if environ is None else environ
    named = _properties_file(env.get("PYSPARK_SUBMIT_ARGS", ""))
    if named:
        return _existing(Path(named))
    if env.get("SPARK_CONF_DIR"):
        folder = Path(env["SPARK_CONF_DIR"])
    else:
        home = env.get("SPARK_HOME")
        if not home:
            try:
                from pyspark.find_spark_home import _find_spark_home

                home = _find_spark_home()
            except (Exception, SystemExit):  # noqa: BLE001 - no pyspark home (it exits): no file either
                return None
        folder = Path(home) / "conf"
    return _existing(folder / DEFAULTS_FILE)


def _existing(path: Path) -> Path | None:
    try:
        return path if path.is_file() else None
    except OSError:  # a folder this user cannot look into: spark-submit could not read it either
        return None


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and i + 6 <= len(text):
                try:
                    out.append(chr(int(text[i + 2:i + 6], 16)))
                    i += 6
                    continue
                except ValueError:
                    pass
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


# Java's `Properties.load` ends a line only at \n, \r or \r\n (str.splitlines also splits at \f, \x1c, \u2028...);
# spark-submit's trim removes characters up to the space, not other Unicode spaces.
_LINE_END = re.compile(r"\r\n|\r|\n")
_JAVA_TRIM = "".join(map(chr, range(33)))


def _logical_lines(text: str):
    pending = ""
    for raw in _LINE_END.split(text):
        line = raw.lstrip(" \t\f")
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:  # an odd number of backslashes: the line goes on
            pending += line[:-1]
            continue
        yield pending + line
        pending = ""
    if pending:
        yield pending


def parse_properties(text: str) -> dict[str, str]:
    """A Java properties file's keys and values (values trimmed, as spark-submit does)."""
    props: dict[str, str] = {}
    for line in _logical_lines(text):
        i, escaped = 0, False
        while i < len(line):
            ch = line[i]
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch in "=: \t\f":
                break
            i += 1
        key, rest = line[:i], line[i:].lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(" \t\f")
        props[_unescape(key)] = _unescape(rest).strip(_JAVA_TRIM)
    return props


def deployment_defaults(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The settings of the deployment's spark-defaults.conf; none when there is no file or it cannot be read."""
    path = defaults_path(environ)
    if path is None:
        return {}
    try:
        return parse_properties(path.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        log.info("spark-defaults.conf not read: %s", exc)
        return {}
