//! `awp grant`, `awp grants`, `awp revoke`, `awp introduce`.

use super::format::{self, str_field};
use super::{out, out_json, Ctx, Failure};
use crate::control::Request;
use serde_json::Value;
use std::time::Duration;

/// The capabilities of `awp grant` / `awp introduce` checked before anything is signed
/// ([`crate::grant::check_cap`]): an unknown name without `--custom` is a usage error
/// (exit 2).
pub fn checked_caps(caps: &[String], custom: bool) -> Result<Vec<String>, Failure> {
    caps.iter()
        .map(|c| {
            crate::grant::check_cap(c, custom).map_err(|e| {
                Failure::usage(
                    e,
                    "check the spelling; for a capability of your own use --custom or custom:NAME",
                )
                .with_code("unknown_cap")
            })
        })
        .collect()
}

/// `awp grant PEER CAP… [--ttl DUR] [--aud PEER]`: prints the grant and its hash.
pub async fn grant(
    ctx: &Ctx,
    peer: String,
    caps: Vec<String>,
    ttl: Duration,
    aud: Option<String>,
) -> Result<(), Failure> {
    let body = ctx
        .call(&Request::Grant {
            peer,
            caps,
            ttl_s: ttl.as_secs().max(1),
            aud,
        })
        .await?;
    if ctx.json {
        return out_json(&Value::Object(body));
    }
    let hash = str_field(&body, &["hash"]).unwrap_or("?");
    let grant = body.get("grant").cloned().unwrap_or(Value::Null);
    out(&format!("grant {hash}"))?;
    out(&grant.to_string())?;
    if body.get("sent").and_then(Value::as_bool) == Some(true) {
        out("sent to the peer")
    } else {
        out("stored; it is sent when the peer connects")
    }
}

/// `awp grants`: issued, held and presented grants with validity.
pub async fn grants(ctx: &Ctx) -> Result<(), Failure> {
    super::commands::list_with(ctx, &Request::Grants, "grants", grants_table).await
}

/// The `awp grants` table: HASH ROLE ISSUER SUBJECT CAPS EXPIRES VALIDITY.
fn grants_table(items: &[Value]) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .filter_map(Value::as_object)
        .map(|g| {
            let who = |k: &str, n: &str| format::peer_label(str_field(g, &[k]), str_field(g, &[n]));
            let caps: Vec<String> = g
                .get("caps")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            vec![
                str_field(g, &["hash"]).unwrap_or("?").to_string(),
                str_field(g, &["role"]).unwrap_or("?").to_string(),
                who("iss", "iss_name"),
                who("sub", "sub_name"),
                caps.join(","),
                str_field(g, &["exp"]).unwrap_or("-").to_string(),
                str_field(g, &["validity"]).unwrap_or("?").to_string(),
            ]
        })
        .collect();
    format::table(
        &[
            "HASH", "ROLE", "ISSUER", "SUBJECT", "CAPS", "EXPIRES", "VALIDITY",
        ],
        &rows,
    )
}

/// `awp revoke HASH`.
pub async fn revoke(ctx: &Ctx, hash: String) -> Result<(), Failure> {
    let body = ctx.call(&Request::Revoke { hash }).await?;
    if ctx.json {
        return out_json(&Value::Object(body));
    }
    out(&format!(
        "revoked {}",
        str_field(&body, &["hash"]).unwrap_or("?")
    ))
}

/// `awp introduce TO PEER [CAP…] [--ttl DUR] [-t THREAD]`.
pub async fn introduce(
    ctx: &Ctx,
    to: String,
    peer: String,
    caps: Vec<String>,
    ttl: Duration,
    th: Option<String>,
) -> Result<(), Failure> {
    let body = ctx
        .call(&Request::Introduce {
            to,
            peer,
            caps,
            ttl_s: ttl.as_secs().max(1),
            th,
        })
        .await?;
    if ctx.json {
        return out_json(&Value::Object(body));
    }
    out(&format!(
        "introduction queued in {}{}",
        str_field(&body, &["th"]).unwrap_or("?"),
        if body.get("grant").is_some_and(|g| !g.is_null()) {
            " with a grant"
        } else {
            ""
        }
    ))
}
