//! Statements through SQLite's statement cache, for the lease store and the daemon's job
//! database: both run the same few statements for every job, and preparing each again every time
//! was a tenth of the daemon's work per job. The cache is the connection's (rusqlite keeps 16
//! statements by default; `Connection::set_prepared_statement_cache_capacity` sets more).

use rusqlite::{Connection, Params, Row};

/// `conn.execute(sql, params)`, with `sql` prepared once per connection.
pub fn exec(conn: &Connection, sql: &str, params: impl Params) -> rusqlite::Result<usize> {
    conn.prepare_cached(sql)?.execute(params)
}

/// `conn.query_row(sql, params, f)`, with `sql` prepared once per connection.
pub fn query_row<T>(
    conn: &Connection,
    sql: &str,
    params: impl Params,
    f: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    conn.prepare_cached(sql)?.query_row(params, f)
}
