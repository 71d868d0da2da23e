"""How the browser tests start Debian's Chromium: headless, on a closed network (without the background-networking
flags its connections are refused, many at a time)."""

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
