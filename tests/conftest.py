import os

# Headless Qt for every test that opens a window; must be set before Qt is imported.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
