//! Transport addresses, listeners and connections: TCP and unix sockets behind one type.
//!
//! Addresses are written `HOST:PORT` or `unix:PATH`. Unix sockets are created with mode 0600
//! and a stale socket file (one nobody is listening on) is replaced; a live one, or a path that
//! is not a socket, is an error.

use std::fmt;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

/// Where to listen or connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    /// A TCP socket address.
    Tcp(SocketAddr),
    /// A unix domain socket path.
    Unix(PathBuf),
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::Tcp(a) => write!(f, "{a}"),
            Addr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl std::str::FromStr for Addr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: address needs a path".into());
            }
            return Ok(Addr::Unix(PathBuf::from(path)));
        }
        let s = if s.starts_with("localhost:") {
            s.replacen("localhost", "127.0.0.1", 1)
        } else {
            s.to_string()
        };
        s.parse::<SocketAddr>()
            .map(Addr::Tcp)
            .map_err(|_| format!("invalid address {s:?}: expected HOST:PORT or unix:PATH"))
    }
}

impl Addr {
    /// Whether the address can only be reached from this machine.
    pub fn is_local(&self) -> bool {
        match self {
            Addr::Tcp(a) => a.ip().is_loopback(),
            Addr::Unix(_) => true,
        }
    }
}

/// The read half of a connection.
pub type BoxRead = Pin<Box<dyn AsyncRead + Send>>;
/// The write half of a connection.
pub type BoxWrite = Pin<Box<dyn AsyncWrite + Send>>;

/// An established connection of any transport, as two halves.
pub struct Conn {
    /// Bytes from the peer.
    pub read: BoxRead,
    /// Bytes to the peer.
    pub write: BoxWrite,
    /// A printable description of the peer.
    pub peer: String,
    /// The socket's descriptor, when it is one (valid while `write` lives): a writer asks the
    /// kernel how much the peer has yet to read.
    pub fd: Option<std::os::fd::RawFd>,
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn").field("peer", &self.peer).finish()
    }
}

impl Conn {
    /// Wraps a TCP stream; Nagle is off because frames are already batched by the writers.
    pub fn tcp(stream: TcpStream) -> Conn {
        let _ = stream.set_nodelay(true);
        let fd = Some(stream.as_raw_fd());
        let peer = stream
            .peer_addr()
            .map_or_else(|_| "tcp".into(), |a| a.to_string());
        let (r, w) = stream.into_split();
        Conn {
            read: Box::pin(r),
            write: Box::pin(w),
            peer,
            fd,
        }
    }

    /// Wraps a unix stream.
    pub fn unix(stream: UnixStream) -> Conn {
        let fd = Some(stream.as_raw_fd());
        let (r, w) = stream.into_split();
        Conn {
            read: Box::pin(r),
            write: Box::pin(w),
            peer: "unix".into(),
            fd,
        }
    }

    /// Wraps any pair of halves (stdio of a child process, in-memory duplex streams).
    pub fn from_halves(
        read: impl AsyncRead + Send + 'static,
        write: impl AsyncWrite + Send + 'static,
        peer: &str,
    ) -> Conn {
        Conn {
            read: Box::pin(read),
            write: Box::pin(write),
            peer: peer.into(),
            fd: None,
        }
    }

    /// Connects to `addr`.
    pub async fn connect(addr: &Addr) -> std::io::Result<Conn> {
        match addr {
            Addr::Tcp(a) => Ok(Conn::tcp(TcpStream::connect(a).await?)),
            Addr::Unix(p) => Ok(Conn::unix(UnixStream::connect(p).await?)),
        }
    }
}

/// A bound listener of either transport.
#[derive(Debug)]
pub enum Listener {
    /// TCP.
    Tcp(TcpListener),
    /// A unix socket; the path is removed when the listener is dropped.
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// Binds `addr`. A unix socket file is created 0600; a stale one is replaced.
    pub async fn bind(addr: &Addr) -> std::io::Result<Listener> {
        match addr {
            Addr::Tcp(a) => Ok(Listener::Tcp(TcpListener::bind(a).await?)),
            Addr::Unix(path) => {
                remove_stale_socket(path)?;
                let listener = bind_unix_private(path)?;
                Ok(Listener::Unix(listener, path.clone()))
            }
        }
    }

    /// The bound address (with the real port when bound to port 0).
    pub fn local_addr(&self) -> std::io::Result<Addr> {
        match self {
            Listener::Tcp(l) => Ok(Addr::Tcp(l.local_addr()?)),
            Listener::Unix(_, p) => Ok(Addr::Unix(p.clone())),
        }
    }

    /// Accepts one connection.
    pub async fn accept(&self) -> std::io::Result<Conn> {
        match self {
            Listener::Tcp(l) => Ok(Conn::tcp(l.accept().await?.0)),
            Listener::Unix(l, _) => Ok(Conn::unix(l.accept().await?.0)),
        }
    }
}

/// Makes `path` free for a new unix socket: nothing there is fine, a socket nobody listens on
/// is removed; a live socket, or anything that is not a socket (a config file given as
/// `unix:relay.toml` by mistake), is an error and is left untouched.
pub fn remove_stale_socket(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            ),
        ));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("{} is in use by a live listener", path.display()),
        ));
    }
    std::fs::remove_file(path)
}

/// Binds inside a fresh 0700 directory, restricts the socket to 0600, then links it into
/// place, so the socket is never reachable by others, not even for an instant.
fn bind_unix_private(path: &std::path::Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let private = parent.join(format!(
        ".gabp-bind-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let staged = private.join("sock");
    let bound = UnixListener::bind(&staged).and_then(|l| {
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
        // A link, not a rename: it fails rather than replace a file that appeared meanwhile.
        std::fs::hard_link(&staged, path)?;
        Ok(l)
    });
    let _ = std::fs::remove_dir_all(&private);
    bound
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}
