"""The Slack surface: bolt listeners, Block Kit rendering, uploads and /kb-reindex."""
