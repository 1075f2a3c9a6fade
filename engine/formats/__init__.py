"""Pure on-disk codecs (bytes and positions in, values out; no file I/O), each module with its byte layout."""
