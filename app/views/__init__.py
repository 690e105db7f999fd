"""Qt widgets of the main window and the panels it is made of; they show engine events and know nothing of the
engine process."""
