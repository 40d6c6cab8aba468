"""`tracetap query`: run a named SQL query from queries/ over the store's views."""

from __future__ import annotations

import click

from tracetap.common import STORE, as_of_option, echo_json, echo_table, key_value_pairs, pinned
from tracetap.store import AsOf, StorePath


def _list(as_json: bool) -> None:
    from tracetap.queries import list_queries

    queries = list_queries()
    columns = ["name", "parameters", "description"]
    rows = [(q.name, ", ".join(f"{p.name}={'null' if p.default is None else p.default}" for p in q.params),
             q.description) for q in queries]
    if not as_json:
        echo_table(columns, rows)
        return
    echo_json(["name", "description", "params"],
              [(q.name, q.description, [vars(p) for p in q.params]) for q in queries])


@click.command()
@click.argument("name", required=False)
@click.option("--store", type=STORE, help="Store directory or object store URL (required unless --list).")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE", callback=key_value_pairs,
              help="Query parameter (see --list for each query's parameters and defaults). Repeatable.")
@click.option("--list", "list_queries", is_flag=True, help="List the named queries and their parameters.")
@click.option("--json", "as_json", is_flag=True, help="Print rows as JSON.")
@as_of_option
def command(name: str | None, store: StorePath | None, params: dict, list_queries: bool, as_json: bool,
            as_of: AsOf | None) -> None:
    """Run the named query NAME (queries/NAME.sql), or list them with --list (--as-of: over the store as it was).

    Example: tracetap query --store runs tool_calls_by_tool --param limit=10
    """
    if list_queries:
        return _list(as_json)
    if not name:
        raise click.UsageError("give a query NAME, or --list to see them")
    if store is None:
        raise click.UsageError("Missing option '--store'.")
    import duckdb

    from tracetap.queries import QueryError, run_query
    from tracetap.store import StoreError, check_store, connect

    try:
        root = check_store(store)
        result = run_query(connect(root, as_of=pinned(root, as_of)), name, params)
    except (QueryError, StoreError) as error:
        raise click.ClickException(str(error)) from None
    except duckdb.Error as error:
        raise click.ClickException(f"query {name} failed: {error}") from None
    columns = [column[0] for column in result.description]
    rows = result.fetchall()
    echo_json(columns, rows) if as_json else echo_table(columns, rows)
