"""Stage `runtime`: executable plans."""
