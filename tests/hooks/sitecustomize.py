"""Imported by every Python process started with tests/hooks on PYTHONPATH (site's sitecustomize): installs the
fault-injection hooks of alpha_rl_test_hooks.py when their environment variables are set. Tests only."""
import alpha_rl_test_hooks

alpha_rl_test_hooks.install()
