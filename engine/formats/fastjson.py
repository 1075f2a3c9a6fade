"""RocketMQ's fastjson text made JSON: its maps keyed by integers carry bare keys (`{0:250}`).

Pure: the offsets reader (ipc.offset_table_codec) and the topic table (engine.topics.table) read
RocketMQ-written config files through it, so both accept what fastjson writes.
"""

from __future__ import annotations


def quote_bare_integer_keys(text: str) -> str:
    """Turn fastjson's `{0:250,1:250}` into `{"0":250,"1":250}`, leaving string literals alone."""
    out: list[str] = []
    i, n = 0, len(text)
    last_structural = ""
    while i < n:
        ch = text[i]
        if ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
            last_structural = '"'
            continue
        if (ch.isdigit() or ch == "-") and last_structural in ("{", ","):
            j = i + 1
            while j < n and text[j].isdigit():
                j += 1
            k = j
            while k < n and text[k].isspace():
                k += 1
            if k < n and text[k] == ":":
                out.append(f'"{text[i:j]}"')
                i = j
                last_structural = '"'
                continue
        if not ch.isspace():
            last_structural = ch
        out.append(ch)
        i += 1
    return "".join(out)
