"""The JSON API: the same flow as the pages (submit, poll, results, download) for scripts and
the `ptxf` command-line client. Bearer-token authentication; errors are JSON with a 4xx code."""
