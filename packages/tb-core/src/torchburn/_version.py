__version__ = "0.1.0"

# Bumped whenever the hook specs or the Engine contract change incompatibly. Engines built for
# another value are refused with a message that says what to install.
PLUGIN_API_VERSION = 1
