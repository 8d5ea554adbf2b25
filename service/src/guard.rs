//! Which requests a browser may make: the `Host` and `Origin` checks that keep web pages of other
//! origins (and DNS-rebinding pages, whose name resolves to this server's address) from driving
//! or reading the server. Binding loopback alone does not protect against a browser on the same
//! machine, so these checks run on every request before any route (see [`crate::server`]).
//!
//! - `Host` must name the bound address: its IP literal (any IP literal when bound to all
//!   interfaces, `0.0.0.0` / `::`), or `localhost` when bound to loopback or all interfaces, with
//!   or without a port; or a name given in [`crate::ServeConfig::allowed_hosts`] (`*`: any). A
//!   rebinding page's requests carry its own domain name as `Host`, so they are refused. A request
//!   without `Host` (HTTP/1.0; browsers always send one) passes.
//! - `Origin`, when present, must be the server's own origin as the request addresses it
//!   (`http://` + the accepted `Host`), or one of [`crate::ServeConfig::allowed_origins`] (`*`:
//!   any). Browsers send `Origin` on every cross-origin request and on same-origin POSTs, so the
//!   page served at `/` passes and a page of another origin is refused before anything runs.
//!
//! Both refusals are 403 with the usual [`ApiError`] body (`forbidden_host`, `forbidden_origin`).

use crate::error::ApiError;
use axum::http::{header, HeaderMap, StatusCode};
use std::net::{IpAddr, SocketAddr};

/// An allowed origin or allowed host flag that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    #[error("allowed origin {0:?} is not an origin like http://example.com:8080 (scheme, host, optional port; no path) or *")]
    Origin(String),
    #[error("allowed host {0:?} is not a host name or IP literal (no scheme, port or path) or *")]
    Host(String),
}

/// A web origin, normalised: lower-case scheme and host, the scheme's default port filled in,
/// IPv6 hosts without brackets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub scheme: String,
    pub host: String,
    pub port: u16,
}

impl std::str::FromStr for Origin {
    type Err = GuardError;
    fn from_str(s: &str) -> Result<Origin, GuardError> {
        let bad = || GuardError::Origin(s.to_string());
        let (scheme, rest) = s.split_once("://").ok_or_else(bad)?;
        let scheme = scheme.to_ascii_lowercase();
        let default_port = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return Err(bad()),
        };
        let (host, port) = split_authority(rest).ok_or_else(bad)?;
        Ok(Origin {
            scheme,
            host,
            port: port.unwrap_or(default_port),
        })
    }
}

/// `host[:port]` or `[v6][:port]` → (lower-case host without brackets or trailing dot, port).
/// None for anything else (empty host, a path, user info, a bad port, a bare IPv6 address).
pub fn split_authority(s: &str) -> Option<(String, Option<u16>)> {
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        v6.parse::<std::net::Ipv6Addr>().ok()?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        (v6, port)
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    let port = match port {
        None => None,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            Some(p.parse::<u16>().ok()?)
        }
        Some(_) => return None,
    };
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    let name_ok = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':'));
    name_ok.then_some((host, port))
}

/// The host and origin rules of one bound listener.
#[derive(Debug, Clone)]
pub struct RequestGuard {
    bound: SocketAddr,
    any_host: bool,
    hosts: Vec<String>,
    any_origin: bool,
    origins: Vec<Origin>,
}

impl RequestGuard {
    /// The rules for a listener bound at `bound`, plus the configured names (`*`: any).
    pub fn new(
        bound: SocketAddr,
        allowed_hosts: &[String],
        allowed_origins: &[String],
    ) -> Result<RequestGuard, GuardError> {
        let mut guard = RequestGuard {
            bound,
            any_host: false,
            hosts: Vec::new(),
            any_origin: false,
            origins: Vec::new(),
        };
        for h in allowed_hosts {
            if h == "*" {
                guard.any_host = true;
                continue;
            }
            match split_authority(h) {
                Some((name, None)) => guard.hosts.push(name),
                _ => return Err(GuardError::Host(h.clone())),
            }
        }
        for o in allowed_origins {
            if o == "*" {
                guard.any_origin = true;
                continue;
            }
            guard.origins.push(o.parse()?);
        }
        Ok(guard)
    }

    /// Ok, or the 403 refusal naming the offending header.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let host = self.check_host(headers)?;
        self.check_origin(headers, host)
    }

    /// The accepted `Host` as (name, port), None when the request has none.
    fn check_host(&self, headers: &HeaderMap) -> Result<Option<(String, Option<u16>)>, ApiError> {
        let mut values = headers.get_all(header::HOST).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(forbidden(
                "forbidden_host",
                "more than one Host header".into(),
            ));
        }
        let text = String::from_utf8_lossy(value.as_bytes());
        let Some((name, port)) = split_authority(&text) else {
            return Err(forbidden(
                "forbidden_host",
                format!("Host header {text:?} is not a host name with an optional port"),
            ));
        };
        if self.host_allowed(&name) {
            return Ok(Some((name, port)));
        }
        Err(forbidden(
            "forbidden_host",
            format!(
                "Host header {text:?} does not name this server ({}); to serve under another name, \
                 start it with --allow-host {name}",
                self.own_names()
            ),
        ))
    }

    fn host_allowed(&self, name: &str) -> bool {
        let ip = self.bound.ip();
        if self.any_host || self.hosts.iter().any(|h| h == name) {
            return true;
        }
        if name == "localhost" {
            return ip.is_loopback() || ip.is_unspecified();
        }
        match name.parse::<IpAddr>() {
            // an IP literal is never a rebinding name: on all interfaces any of ours may be used
            Ok(named) => named == ip || ip.is_unspecified(),
            Err(_) => false,
        }
    }

    fn own_names(&self) -> String {
        let ip = self.bound.ip();
        if ip.is_unspecified() {
            "an IP address or localhost".to_string()
        } else if ip.is_loopback() {
            format!("{} or localhost", self.bound_host())
        } else {
            self.bound_host()
        }
    }

    fn bound_host(&self) -> String {
        match self.bound.ip() {
            IpAddr::V6(v6) => format!("[{v6}]"),
            IpAddr::V4(v4) => v4.to_string(),
        }
    }

    fn check_origin(
        &self,
        headers: &HeaderMap,
        host: Option<(String, Option<u16>)>,
    ) -> Result<(), ApiError> {
        let Some(value) = headers.get(header::ORIGIN) else {
            return Ok(());
        };
        if self.any_origin {
            return Ok(());
        }
        let text = String::from_utf8_lossy(value.as_bytes());
        let origin = text.parse::<Origin>().ok();
        // the server's own origin as this request addresses it: plain http at the accepted Host
        let own = match host {
            Some((name, port)) => Origin {
                scheme: "http".into(),
                host: name.trim_start_matches('[').trim_end_matches(']').into(),
                port: port.unwrap_or(80),
            },
            None => Origin {
                scheme: "http".into(),
                host: self.bound.ip().to_string(),
                port: self.bound.port(),
            },
        };
        match origin {
            Some(o) if o == own || self.origins.contains(&o) => Ok(()),
            _ => Err(forbidden(
                "forbidden_origin",
                format!(
                    "requests from the web origin {text:?} are refused (this server's own origin is \
                     http://{}:{}); to allow a page of that origin, start the server with \
                     --allow-origin",
                    if own.host.contains(':') {
                        format!("[{}]", own.host)
                    } else {
                        own.host.clone()
                    },
                    own.port
                ),
            )),
        }
    }
}

fn forbidden(kind: &'static str, message: String) -> ApiError {
    ApiError::bad(kind, "<root>", message).with_status(StatusCode::FORBIDDEN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn guard(bound: &str, hosts: &[&str], origins: &[&str]) -> RequestGuard {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        RequestGuard::new(bound.parse().unwrap(), &s(hosts), &s(origins)).unwrap()
    }

    fn kind(g: &RequestGuard, h: &[(&'static str, &str)]) -> Option<&'static str> {
        g.check(&headers(h)).err().map(|e| {
            assert_eq!(e.status, StatusCode::FORBIDDEN);
            e.kind
        })
    }

    #[test]
    fn host_must_name_the_bound_address() {
        let g = guard("127.0.0.1:8080", &[], &[]);
        for ok in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "localhost:8080",
            "LOCALHOST",
            "localhost.",
        ] {
            assert_eq!(kind(&g, &[("host", ok)]), None, "{ok}");
        }
        assert_eq!(kind(&g, &[]), None, "no Host: not a browser");
        for bad in [
            "evil.example:8080",
            "evil.example",
            "10.0.0.1:8080",
            "127.0.0.1.evil.example",
            "localhost:99999",
            "user@localhost",
            "localhost/x",
            "",
        ] {
            assert_eq!(kind(&g, &[("host", bad)]), Some("forbidden_host"), "{bad}");
        }
        assert_eq!(
            kind(&g, &[("host", "localhost"), ("host", "localhost")]),
            Some("forbidden_host")
        );
        let v6 = guard("[::1]:80", &[], &[]);
        assert_eq!(kind(&v6, &[("host", "[::1]:80")]), None);
        assert_eq!(kind(&v6, &[("host", "localhost")]), None);
        assert_eq!(kind(&v6, &[("host", "127.0.0.1")]), Some("forbidden_host"));
        let lan = guard("192.168.1.5:80", &[], &[]);
        assert_eq!(kind(&lan, &[("host", "192.168.1.5")]), None);
        assert_eq!(kind(&lan, &[("host", "localhost")]), Some("forbidden_host"));
        let all = guard("0.0.0.0:80", &[], &[]);
        for ok in ["10.1.2.3", "[fe80::1]:80", "localhost"] {
            assert_eq!(kind(&all, &[("host", ok)]), None, "{ok}");
        }
        assert_eq!(
            kind(&all, &[("host", "rebind.example")]),
            Some("forbidden_host")
        );
    }

    #[test]
    fn allowed_hosts_extend_the_names() {
        let g = guard("127.0.0.1:8080", &["scorer.internal"], &[]);
        assert_eq!(kind(&g, &[("host", "Scorer.Internal:443")]), None);
        assert_eq!(
            kind(&g, &[("host", "other.internal")]),
            Some("forbidden_host")
        );
        let any = guard("127.0.0.1:8080", &["*"], &[]);
        assert_eq!(kind(&any, &[("host", "whatever.example")]), None);
        for bad in ["http://x", "x:80", "x/y", ""] {
            assert!(
                RequestGuard::new("127.0.0.1:1".parse().unwrap(), &[bad.to_string()], &[]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn origin_must_be_the_servers_own() {
        let g = guard("127.0.0.1:8080", &[], &[]);
        let same = [
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080"),
        ];
        assert_eq!(kind(&g, &same), None);
        let local = [
            ("host", "localhost:8080"),
            ("origin", "http://localhost:8080"),
        ];
        assert_eq!(kind(&g, &local), None);
        for bad in [
            "http://evil.example",
            "http://127.0.0.1:8081",
            "https://127.0.0.1:8080",
            "http://localhost:8080",
            "null",
            "",
        ] {
            assert_eq!(
                kind(&g, &[("host", "127.0.0.1:8080"), ("origin", bad)]),
                Some("forbidden_origin"),
                "{bad}"
            );
        }
        // no Host: the bound address is the own origin
        assert_eq!(kind(&g, &[("origin", "http://127.0.0.1:8080")]), None);
        // default ports
        let p80 = guard("127.0.0.1:80", &[], &[]);
        assert_eq!(
            kind(
                &p80,
                &[("host", "localhost"), ("origin", "http://localhost:80")]
            ),
            None
        );
        let v6 = guard("[::1]:8080", &[], &[]);
        assert_eq!(
            kind(
                &v6,
                &[("host", "[::1]:8080"), ("origin", "http://[::1]:8080")]
            ),
            None
        );
    }

    #[test]
    fn allowed_origins_extend_the_own() {
        let g = guard("127.0.0.1:8080", &[], &["https://app.example"]);
        let h = |o| [("host", "127.0.0.1:8080"), ("origin", o)];
        assert_eq!(kind(&g, &h("https://APP.example:443")), None);
        assert_eq!(kind(&g, &h("http://app.example")), Some("forbidden_origin"));
        let any = guard("127.0.0.1:8080", &[], &["*"]);
        assert_eq!(kind(&any, &h("http://evil.example")), None);
        for bad in ["app.example", "ftp://x", "http://x/path", "http://"] {
            assert!(
                RequestGuard::new("127.0.0.1:1".parse().unwrap(), &[], &[bad.to_string()]).is_err(),
                "{bad}"
            );
        }
    }
}
