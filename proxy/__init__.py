"""mitmproxy addon: allowlist, API-key injection, journal of every model call."""
