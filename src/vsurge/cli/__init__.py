"""The command line: `vsurge generate`, `vsurge chat`, `vsurge serve` and `vsurge bench serve`.

- arguments.py: every command's flags (`build_parser`), the model flags declared once for all of them;
- commands.py: runs each command (`main`, the `vsurge` console script);
- local_engine.py: the engine behind generate and chat (one user); chat_session.py: chat's conversation loop;
- served_models.py: `vsurge serve` with several models (loaded on demand);
- bench_serve.py, bench_plot.py: `vsurge bench serve`, a load test of any OpenAI-compatible server.
"""

from .arguments import build_parser
from .commands import main

__all__ = ["build_parser", "main"]
