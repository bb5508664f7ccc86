"""Limits the executor enforces, read from the native module so that Python never keeps a copy."""

from __future__ import annotations

MAX_EPILOGUE = 4
