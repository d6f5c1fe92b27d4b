"""The Slack surface: the bolt app, its listeners (``handlers``), Block Kit (``blocks``), the people it
serves (``people``), uploads, approvals, the Home tab, hand-offs and /kb-reindex."""
