"""Workflows for the parallel-branch process tests (tests/test_processes_branches.py)."""

from __future__ import annotations
