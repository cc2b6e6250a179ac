"""What every stage script shares: its argv and paths, its params checked, a failure said in one line."""
