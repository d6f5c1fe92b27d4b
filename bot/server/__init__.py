"""The surface-neutral web server: document viewer, original files, health checks, and the bounds every client is held to."""
