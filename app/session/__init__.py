"""The session apart from its views: trace files and their JSON, the K tuner's replays, Compare's verdict, names
shown to users."""
