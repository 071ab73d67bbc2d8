//! The Parquet export: one row per frame (the shared [`Row`]), compressed ([`codec`]: Zstd),
//! written row group by row group so that memory stays bounded
//! whatever the session's length.
//!
//! One session named by id goes to one file; a selection goes to a Hive-partitioned directory,
//! `route=R/date=YYYY-MM-DD/session=ID.parquet`, built in a temporary directory beside the
//! target and renamed into place whole. The files of a directory leave out the `route` column:
//! the partition carries it, and DuckDB refuses a file column that repeats a partition key.
//!
//! The columns ([`schema`]) are a contract, listed in the README and pinned by a test.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{
    Float64Builder, Int64Builder, MapBuilder, MapFieldNames, StringBuilder,
    TimestampNanosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef, TimeUnit};
use gabp_storage::{SessionMeta, Store};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::errors::ParquetError;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use super::{for_each_row, write_atomically, ExportError, ExportFilter, Kind, Row};

/// Rows per row group: large enough for scans to read long runs, small enough that one
/// group's arrays stay a few tens of MiB.
pub const GROUP_ROWS: usize = 128 * 1024;
/// A row group is closed early once its text columns hold this much (large payloads).
pub const GROUP_BYTES: usize = 64 << 20;

/// The columns, in order. `with_route` is false for the files of a Hive directory, whose
/// `route=` partition supplies the route.
pub fn schema(with_route: bool) -> SchemaRef {
    let text = |name: &str, nullable| Field::new(name, DataType::Utf8, nullable);
    let int = |name: &str, nullable| Field::new(name, DataType::Int64, nullable);
    let mut fields = vec![text("session", false)];
    if with_route {
        fields.push(text("route", false));
    }
    fields.extend([
        int("frame", false),
        Field::new(
            "t_ns",
            DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            false,
        ),
        Field::new("offset_ms", DataType::Float64, false),
        text("dir", false),
        int("conn", false),
        text("bridge", true),
        text("kind", false),
        text("method", true),
        text("id", true),
        text("channel", true),
        int("mod_seq", true),
        int("relay_seq", true),
        int("error_code", true),
        text("payload", true),
        text("label", true),
        text("data", true),
        Field::new("tags", tags_type(), false),
        // Last: columns are only ever added after the ones readers already know.
        int("episode", true),
    ]);
    Arc::new(Schema::new(fields))
}

/// `tags`: Parquet's standard map layout (`key_value` of `key`, `value`).
fn tags_type() -> DataType {
    let entries = Fields::from(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("value", DataType::Utf8, true),
    ]);
    DataType::Map(
        Arc::new(Field::new("key_value", DataType::Struct(entries), false)),
        false,
    )
}

/// The compression: Zstd at level 1 (fast; most of the size gain of higher levels on frames).
pub fn codec() -> Compression {
    Compression::ZSTD(parquet::basic::ZstdLevel::default())
}

/// The codec, statistics per column chunk, and no dictionary for columns that are nearly unique per
/// row (a dictionary there only costs time before Parquet gives up on it).
fn properties() -> WriterProperties {
    let mut b = WriterProperties::builder()
        .set_compression(codec())
        .set_max_row_group_row_count(Some(GROUP_ROWS))
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_created_by(format!("gabp-relay {}", env!("CARGO_PKG_VERSION")));
    for c in [
        "frame",
        "t_ns",
        "offset_ms",
        "id",
        "mod_seq",
        "relay_seq",
        "payload",
        "data",
    ] {
        b = b.set_column_dictionary_enabled(ColumnPath::from(c), false);
    }
    // Min/max of JSON text helps no query and costs a comparison per row.
    for c in ["payload", "data", "id"] {
        b = b.set_column_statistics_enabled(ColumnPath::from(c), EnabledStatistics::None);
    }
    b.build()
}

/// The column builders of the row group being filled.
struct Columns {
    session: StringBuilder,
    route: Option<StringBuilder>,
    frame: Int64Builder,
    t_ns: TimestampNanosecondBuilder,
    offset_ms: Float64Builder,
    dir: StringBuilder,
    conn: Int64Builder,
    bridge: StringBuilder,
    kind: StringBuilder,
    method: StringBuilder,
    id: StringBuilder,
    channel: StringBuilder,
    mod_seq: Int64Builder,
    relay_seq: Int64Builder,
    error_code: Int64Builder,
    payload: StringBuilder,
    label: StringBuilder,
    data: StringBuilder,
    tags: MapBuilder<StringBuilder, StringBuilder>,
    episode: Int64Builder,
    rows: usize,
    bytes: usize,
}

/// Parquet stores signed integers; a frame number or seq never nears 2^63.
fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Columns {
    fn new(with_route: bool) -> Self {
        let names = MapFieldNames {
            entry: "key_value".into(),
            key: "key".into(),
            value: "value".into(),
        };
        Columns {
            session: StringBuilder::new(),
            route: with_route.then(StringBuilder::new),
            frame: Int64Builder::new(),
            t_ns: TimestampNanosecondBuilder::new().with_timezone("UTC"),
            offset_ms: Float64Builder::new(),
            dir: StringBuilder::new(),
            conn: Int64Builder::new(),
            bridge: StringBuilder::new(),
            kind: StringBuilder::new(),
            method: StringBuilder::new(),
            id: StringBuilder::new(),
            channel: StringBuilder::new(),
            mod_seq: Int64Builder::new(),
            relay_seq: Int64Builder::new(),
            error_code: Int64Builder::new(),
            payload: StringBuilder::new(),
            label: StringBuilder::new(),
            data: StringBuilder::new(),
            tags: MapBuilder::new(Some(names), StringBuilder::new(), StringBuilder::new()),
            episode: Int64Builder::new(),
            rows: 0,
            bytes: 0,
        }
    }

    fn push(
        &mut self,
        meta: &SessionMeta,
        session: &str,
        row: &Row<'_>,
    ) -> Result<(), ExportError> {
        let rec = row.rec;
        self.session.append_value(session);
        if let Some(r) = &mut self.route {
            r.append_value(&meta.route);
        }
        self.frame.append_value(i64_of(row.frame));
        self.t_ns.append_value(i64_of(rec.time_ns));
        self.offset_ms
            .append_value(rec.time_ns.saturating_sub(meta.started_ns) as f64 / 1e6);
        self.dir.append_value(rec.dir.as_str());
        self.conn.append_value(i64::from(rec.conn));
        self.bridge.append_option(row.bridge_name);
        self.kind.append_value(row.kind.as_str());
        self.method.append_option(row.method.as_deref());
        self.id.append_option(row.id.as_deref());
        self.channel.append_option(row.channel);
        self.mod_seq.append_option(rec.mod_seq.map(i64_of));
        self.relay_seq.append_option(rec.relay_seq.map(i64_of));
        self.error_code.append_option(row.error_code);
        self.payload.append_option(row.payload.as_deref());
        let (label, data) = match row.kind {
            Kind::Mark => (row.label.as_deref(), row.data.as_deref()),
            _ => (None, None),
        };
        self.label.append_option(label);
        self.data.append_option(data);
        for (k, v) in &meta.tags {
            self.tags.keys().append_value(k);
            self.tags.values().append_value(v);
        }
        self.tags
            .append(true)
            .map_err(|e| ExportError::Parquet(e.to_string()))?;
        self.episode.append_option(row.episode.map(i64_of));
        self.rows += 1;
        self.bytes += rec.body.len();
        Ok(())
    }

    fn full(&self) -> bool {
        self.rows >= GROUP_ROWS || self.bytes >= GROUP_BYTES
    }

    /// The filled rows as a batch; the builders start over empty.
    fn finish(&mut self, schema: &SchemaRef) -> Result<RecordBatch, ExportError> {
        let mut cols: Vec<ArrayRef> = vec![Arc::new(self.session.finish())];
        if let Some(r) = &mut self.route {
            cols.push(Arc::new(r.finish()));
        }
        cols.extend::<[ArrayRef; 18]>([
            Arc::new(self.frame.finish()),
            Arc::new(self.t_ns.finish()),
            Arc::new(self.offset_ms.finish()),
            Arc::new(self.dir.finish()),
            Arc::new(self.conn.finish()),
            Arc::new(self.bridge.finish()),
            Arc::new(self.kind.finish()),
            Arc::new(self.method.finish()),
            Arc::new(self.id.finish()),
            Arc::new(self.channel.finish()),
            Arc::new(self.mod_seq.finish()),
            Arc::new(self.relay_seq.finish()),
            Arc::new(self.error_code.finish()),
            Arc::new(self.payload.finish()),
            Arc::new(self.label.finish()),
            Arc::new(self.data.finish()),
            Arc::new(self.tags.finish()),
            Arc::new(self.episode.finish()),
        ]);
        self.rows = 0;
        self.bytes = 0;
        RecordBatch::try_new(schema.clone(), cols).map_err(|e| ExportError::Parquet(e.to_string()))
    }
}

/// I/O failures keep their own message; the rest are the encoder's.
fn parquet_err(e: ParquetError) -> ExportError {
    match e {
        ParquetError::External(inner) => match inner.downcast::<std::io::Error>() {
            Ok(io) => ExportError::Io(*io),
            Err(other) => ExportError::Parquet(other.to_string()),
        },
        other => ExportError::Parquet(other.to_string()),
    }
}

/// Writes one session's rows as a Parquet file into `out`; returns how many rows.
pub fn write_session<W: Write + Send>(
    store: &Store,
    meta: &SessionMeta,
    filter: &ExportFilter,
    with_route: bool,
    out: W,
) -> Result<u64, ExportError> {
    let meta = &*store.with_details(meta)?;
    let schema = schema(with_route);
    let mut writer =
        ArrowWriter::try_new(out, schema.clone(), Some(properties())).map_err(parquet_err)?;
    let mut cols = Columns::new(with_route);
    let session = meta.id.to_string();
    let rows = for_each_row(store, meta, filter, |row| {
        cols.push(meta, &session, row)?;
        if cols.full() {
            writer.write(&cols.finish(&schema)?).map_err(parquet_err)?;
            // Close the row group now: its encoded pages leave memory for the file.
            writer.flush().map_err(parquet_err)?;
        }
        Ok(())
    })?;
    if cols.rows > 0 {
        writer.write(&cols.finish(&schema)?).map_err(parquet_err)?;
    }
    let mut out = writer.into_inner().map_err(parquet_err)?;
    out.flush()?;
    Ok(rows)
}

/// Exports one session into the file `path`, atomically (see [`write_atomically`]); returns
/// how many rows.
pub fn export_to_file(
    store: &Store,
    meta: &SessionMeta,
    filter: &ExportFilter,
    path: &Path,
) -> Result<u64, ExportError> {
    write_atomically(path, |f| {
        write_session(store, meta, filter, true, std::io::BufWriter::new(f))
    })
}

/// One file of a Hive export.
#[derive(Debug, Clone)]
pub struct Written {
    /// The session.
    pub session: String,
    /// Its file, relative to the directory.
    pub file: PathBuf,
    /// Rows written.
    pub rows: u64,
}

/// The longest escaped route a `route=` directory holds whole; every valid route name fits
/// (64 bytes, three escaped bytes each at most), and the name stays under the file systems'
/// 255-byte limit.
const MAX_ESCAPED_ROUTE: usize = 200;

/// Where a session's file goes in a Hive directory: `route=R/date=YYYY-MM-DD/session=ID.parquet`
/// (the route escaped, the date the session's start in UTC). A route too long for a file
/// name (only a data dir from before route names were bounded has one) is cut and told apart
/// by a hash of the whole: `route=PREFIX~HASH`.
pub fn hive_path(meta: &SessionMeta) -> PathBuf {
    let date = jiff::Timestamp::from_nanosecond(i128::from(meta.started_ns))
        .ok()
        .map(|t| t.to_zoned(jiff::tz::TimeZone::UTC).date().to_string())
        .unwrap_or_else(|| "1970-01-01".into());
    PathBuf::from(format!("route={}", route_component(&meta.route)))
        .join(format!("date={date}"))
        .join(format!("session={}.parquet", meta.id))
}

/// A route as a `route=` directory names it: escaped, and cut with a hash when too long.
fn route_component(route: &str) -> String {
    let escaped = escape(route);
    if escaped.len() <= MAX_ESCAPED_ROUTE {
        return escaped;
    }
    // Cut before a `%XX`, never inside one.
    let mut cut = MAX_ESCAPED_ROUTE - 20;
    while escaped[..cut].rfind('%').is_some_and(|p| p + 3 > cut) {
        cut -= 1;
    }
    use sha2::Digest;
    let sum = sha2::Sha256::digest(route.as_bytes());
    let hash: String = sum[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{}~{hash}", &escaped[..cut])
}

/// Hive's escaping of a partition value: `%XX` for every byte outside `[A-Za-z0-9._-]`, so a
/// route name can hold `/`, `=`, spaces or anything else and stay one path component (and a
/// leading `.` is escaped so that no reader takes the directory for a hidden one).
pub fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for (i, b) in value.bytes().enumerate() {
        let plain = b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || (b == b'.' && i > 0);
        if plain {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What to do when the target directory exists and is not empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// Fail before writing anything.
    Refuse,
    /// Replace it (the old directory is removed once the new one is in place).
    Replace,
}

/// Whether `dir` exists as a directory with something in it.
pub fn non_empty_dir(dir: &Path) -> std::io::Result<bool> {
    match std::fs::read_dir(dir) {
        Ok(mut it) => Ok(it.next().is_some()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Exports the sessions into a Hive-partitioned directory at `dir` (a session left out for
/// lacking the episode asked for has no file: see [`ExportFilter::skip_without_episode`]).
/// Everything is written in a temporary directory beside it first; `dir` appears (or is replaced) by a rename only when
/// every file was written, so a failed export leaves `dir` as it was.
pub fn export_hive(
    store: &Store,
    metas: &[SessionMeta],
    filter: &ExportFilter,
    dir: &Path,
    existing: Existing,
) -> Result<Vec<Written>, ExportError> {
    // Every step below happens in the one directory pinned here (see `PinnedDir`): a link on
    // the way to it swapped meanwhile cannot put the work dir in one place and the result in
    // another.
    let pinned = super::atomic::PinnedDir::of_output(dir)?;
    let parent = pinned.base();
    let target = pinned.target(dir, "directory")?;
    if super::is_link_to_a_directory(&target) {
        // Replacing would replace the link, not the directory it leads to: neither is what
        // `-o LINK` plainly asks for.
        return Err(ExportError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "it is a symbolic link to a directory: give the directory itself",
        )));
    }
    let had = non_empty_dir(&target)?;
    if had && existing == Existing::Refuse {
        return Err(ExportError::Io(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "the directory exists and is not empty",
        )));
    }
    // The work dir is named after this process, so that what a killed export left is removed
    // by the next one here (see `super::atomic`).
    super::atomic::sweep_leftovers(parent, EXPORT_PREFIX, true);
    let tmp = super::atomic::work_dir(parent, EXPORT_PREFIX)?;
    let mut written = Vec::with_capacity(metas.len());
    for meta in metas {
        let rel = hive_path(meta);
        let path = tmp.path().join(&rel);
        // Private like a single file's export (the work dir itself is 0700): a directory
        // placed as it was written must not open up to others once moved or copied.
        if let Some(p) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(p)?;
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        let mut out = std::io::BufWriter::new(&file);
        let rows = match write_session(store, meta, filter, false, &mut out) {
            Ok(rows) => rows,
            Err(ExportError::NoEpisode { .. }) if filter.skip_without_episode => {
                // Left out whole: no file, and no partition directory holding nothing.
                drop(out);
                std::fs::remove_file(&path)?;
                for dir in path.ancestors().skip(1).take(2) {
                    let _ = std::fs::remove_dir(dir);
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        drop(out);
        file.sync_all()?;
        written.push(Written {
            session: meta.id.to_string(),
            file: rel,
            rows,
        });
    }
    let tmp = tmp.keep();
    // What is placed carries no work mark (a mark left by a kill just here costs one stray
    // file inside the new directory, never a sweep of it: it is no longer a work dir's name).
    super::atomic::unmark(&tmp)?;
    let placed = match std::fs::rename(&tmp, &target) {
        Ok(()) => Ok(()),
        // Only an empty directory can be renamed over: move a full one aside first.
        Err(_) if had || target.is_dir() => replace_dir(&tmp, &target, parent),
        Err(e) => Err(e),
    };
    if let Err(e) = placed {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e.into());
    }
    Ok(written)
}

/// Prefix of a Parquet directory export's hidden work dir.
const EXPORT_PREFIX: &str = ".gabp-export-";

/// Puts `new` where `dir` is: `dir` moves aside, `new` takes its name, the old one is removed.
/// Should the second rename fail, the old directory is moved back.
fn replace_dir(new: &Path, dir: &Path, parent: &Path) -> std::io::Result<()> {
    // The old directory goes inside a marked work dir: if this process is killed while
    // removing it, the next export here removes the rest (the mark goes last).
    let aside = super::atomic::work_dir(parent, EXPORT_PREFIX)?.keep();
    let old = aside.join("old");
    std::fs::rename(dir, &old)?;
    if let Err(e) = std::fs::rename(new, dir) {
        let _ = std::fs::rename(&old, dir);
        let _ = std::fs::remove_dir_all(&aside);
        return Err(e);
    }
    std::fs::remove_dir_all(&old)?;
    std::fs::remove_dir_all(&aside)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_values_are_escaped_to_one_component() {
        assert_eq!(escape("lab-1_a.b"), "lab-1_a.b");
        assert_eq!(escape("a/b=c d"), "a%2Fb%3Dc%20d");
        assert_eq!(escape(".."), "%2E.");
        assert_eq!(escape("é"), "%C3%A9");
        let meta = SessionMeta {
            route: "x/y".into(),
            started_ns: 1_796_040_000_000_000_000,
            ..SessionMeta::default()
        };
        let p = hive_path(&meta);
        assert_eq!(
            p.to_str().expect("utf-8"),
            format!("route=x%2Fy/date=2026-11-30/session={}.parquet", meta.id)
        );
        // The longest valid names fit whole; longer ones are cut to a file name, apart.
        for whole in ["é".repeat(32), "a".repeat(64)] {
            assert_eq!(route_component(&whole), escape(&whole));
        }
        let dir = |route: String| {
            let m = SessionMeta {
                route,
                ..meta.clone()
            };
            hive_path(&m)
                .components()
                .next()
                .expect("route=")
                .as_os_str()
                .len()
        };
        for long in ["é".repeat(150), "a".repeat(300), "%/".repeat(200)] {
            let c = route_component(&long);
            assert!(c.len() <= MAX_ESCAPED_ROUTE, "{c}");
            assert!(dir(long.clone()) <= 255);
            let mut other = long.clone();
            other.push('x');
            assert_ne!(c, route_component(&other), "told apart");
            // Cut between escapes: every `%` is followed by two hex digits.
            let body = c.split('~').next().expect("body");
            for (i, _) in body.match_indices('%') {
                assert!(body.len() >= i + 3, "{body}");
            }
        }
    }

    /// A store with no sessions in `dir/data`: exporting none still places a directory.
    fn empty_store(dir: &Path) -> Store {
        Store::open(&dir.join("data"), gabp_storage::StoreOptions::default()).expect("store")
    }

    /// A linked parent dir swapped between two dirs while directory exports are placed
    /// through it (`dirl/out`): each export's work dir and result are in one dir, so none is
    /// ever left behind in either.
    #[test]
    fn a_parent_swapped_while_exporting_leaves_no_work_dir() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().expect("tempdir");
        let store = empty_store(dir.path());
        let (real, other) = (dir.path().join("real"), dir.path().join("other"));
        std::fs::create_dir(&real).expect("mkdir");
        std::fs::create_dir(&other).expect("mkdir");
        let dirl = dir.path().join("dirl");
        let stop = Arc::new(AtomicBool::new(false));
        let swapper =
            super::super::atomic::tests::swapping(&dirl, [real.clone(), other.clone()], &stop);
        let out = dirl.join("out");
        let mut placed = 0;
        for _ in 0..500 {
            let r = export_hive(
                &store,
                &[],
                &ExportFilter::default(),
                &out,
                Existing::Replace,
            );
            placed += usize::from(r.is_ok());
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().expect("swapper");
        assert!(swaps > 50, "the link hardly moved ({swaps} swaps)");
        assert!(placed > 0, "no export was placed");
        for d in [&real, &other] {
            let names: Vec<String> = std::fs::read_dir(d)
                .expect("read_dir")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            assert!(
                names.iter().all(|n| n == "out"),
                "{}: {names:?}",
                d.display()
            );
        }
    }

    /// `-o LINK` to a directory is refused, leaving the link and its directory as they were.
    #[test]
    fn a_link_to_a_directory_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = empty_store(dir.path());
        let real = dir.path().join("real");
        std::fs::create_dir(&real).expect("mkdir");
        std::fs::write(real.join("keep"), "k").expect("write");
        let link = dir.path().join("latest");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        let r = export_hive(
            &store,
            &[],
            &ExportFilter::default(),
            &link,
            Existing::Replace,
        );
        let e = r.expect_err("exported through a link");
        assert!(
            e.to_string().contains("symbolic link to a directory"),
            "{e}"
        );
        assert!(std::fs::symlink_metadata(&link).expect("meta").is_symlink());
        assert_eq!(
            std::fs::read_to_string(real.join("keep")).expect("read"),
            "k"
        );
    }
}
