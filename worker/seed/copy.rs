//! Buffers rows in PostgreSQL's COPY text format and sends them in one `COPY … FROM STDIN`.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

/// Rows for one table, ready to be copied.
pub struct CopyTable {
    table: &'static str,
    columns: &'static str,
    buf: String,
    rows: u64,
}

impl CopyTable {
    pub fn new(table: &'static str, columns: &'static str) -> Self {
        Self {
            table,
            columns,
            buf: String::new(),
            rows: 0,
        }
    }

    pub fn table(&self) -> &'static str {
        self.table
    }

    /// Starts a row; fields are appended in column order.
    pub fn row(&mut self) -> Row<'_> {
        self.rows += 1;
        Row {
            buf: &mut self.buf,
            first: true,
        }
    }

    /// Sends the buffered rows and empties the buffer; returns how many rows went.
    ///
    /// # Errors
    /// Any database error of the COPY.
    pub async fn flush(&mut self, conn: &mut PgConnection) -> Result<u64, sqlx::Error> {
        if self.rows == 0 {
            return Ok(0);
        }
        let statement = format!("COPY {} ({}) FROM STDIN", self.table, self.columns);
        let mut copy = conn.copy_in_raw(&statement).await?;
        copy.send(std::mem::take(&mut self.buf).into_bytes())
            .await?;
        copy.finish().await?;
        Ok(std::mem::take(&mut self.rows))
    }
}

/// One row being written; each method appends one field.
pub struct Row<'a> {
    buf: &'a mut String,
    first: bool,
}

impl Row<'_> {
    fn sep(&mut self) {
        if !self.first {
            self.buf.push('\t');
        }
        self.first = false;
    }

    pub fn uuid(mut self, id: Uuid) -> Self {
        self.sep();
        write!(self.buf, "{id}").expect("writing to a String");
        self
    }

    pub fn opt_uuid(self, id: Option<Uuid>) -> Self {
        match id {
            Some(id) => self.uuid(id),
            None => self.null(),
        }
    }

    pub fn int(mut self, n: i64) -> Self {
        self.sep();
        write!(self.buf, "{n}").expect("writing to a String");
        self
    }

    pub fn opt_int(self, n: Option<i64>) -> Self {
        match n {
            Some(n) => self.int(n),
            None => self.null(),
        }
    }

    pub fn bool(mut self, b: bool) -> Self {
        self.sep();
        self.buf.push(if b { 't' } else { 'f' });
        self
    }

    pub fn ts(mut self, at: DateTime<Utc>) -> Self {
        self.sep();
        write!(self.buf, "{}", at.format("%Y-%m-%d %H:%M:%S%.6f+00")).expect("writing to a String");
        self
    }

    pub fn opt_ts(self, at: Option<DateTime<Utc>>) -> Self {
        match at {
            Some(at) => self.ts(at),
            None => self.null(),
        }
    }

    /// Text (or JSON) with COPY's escapes for backslash, tab, newline and carriage return.
    pub fn text(mut self, s: &str) -> Self {
        self.sep();
        for ch in s.chars() {
            match ch {
                '\\' => self.buf.push_str("\\\\"),
                '\t' => self.buf.push_str("\\t"),
                '\n' => self.buf.push_str("\\n"),
                '\r' => self.buf.push_str("\\r"),
                other => self.buf.push(other),
            }
        }
        self
    }

    pub fn opt_text(self, s: Option<&str>) -> Self {
        match s {
            Some(s) => self.text(s),
            None => self.null(),
        }
    }

    pub fn null(mut self) -> Self {
        self.sep();
        self.buf.push_str("\\N");
        self
    }

    /// Ends the row.
    pub fn end(self) {
        self.buf.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_escaped_and_separated() {
        let mut t = CopyTable::new("t", "a, b, c");
        t.row().text("x\ty\\z\n").null().bool(true).end();
        assert_eq!(t.buf, "x\\ty\\\\z\\n\t\\N\tt\n");
        assert_eq!(t.rows, 1);
    }
}
