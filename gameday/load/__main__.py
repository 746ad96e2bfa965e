"""``python -m gameday.load --help``: list the options locustfiles/llm.py adds to Locust.

Locust prints its ``--help`` before importing the locustfile, so these never show there.
"""

from gameday.load.options import plain_parser

if __name__ == "__main__":
    plain_parser().parse_args()
