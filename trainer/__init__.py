"""alpha-rl trainer: data → features → sim → agent → loop → checkpoint → folds → report."""
