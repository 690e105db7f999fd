"""Windows and dialogs opened from the main window: Compare, Tune K, the model load, a saved trace."""
