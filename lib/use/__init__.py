"""Using a trained model: from Python (inference), from the shell (generate), in a browser (serve)."""
