// Store: templates, and which layers are in use (docs/design/templates.md).

#include <nlohmann/json.hpp>

#include "daemon/store/store.h"

namespace airlock::store {
namespace {

using json = nlohmann::json;

constexpr std::string_view kTemplateColumns =
    "name, state, source, spec, layers, created_at_ms, updated_at_ms, error, tenant";

Result<TemplateState> ParseTemplateState(std::string_view name) {
  for (TemplateState s : {TemplateState::kBuilding, TemplateState::kReady, TemplateState::kFailed}) {
    if (TemplateStateName(s) == name) return s;
  }
  return Fail(ErrorCode::kInternal, "unknown template state '" + std::string(name) + "'");
}

Status ValidateTemplate(const TemplateRecord& r) {
  if (r.name.empty() || r.name.size() > 64) {
    return Fail(ErrorCode::kInvalidArgument, "a template name has 1 to 64 characters");
  }
  json spec = json::parse(r.spec, nullptr, /*allow_exceptions=*/false);
  if (spec.is_discarded() || !spec.is_object()) {
    return Fail(ErrorCode::kInvalidArgument, "a template's spec must be a JSON object");
  }
  if (!r.tenant.empty()) return ValidateTenant(r.tenant);  // "" is shared
  return {};
}

Result<std::string> LayersJson(const std::vector<std::string>& layers) {
  try {
    return json(layers).dump();
  } catch (const json::exception&) {
    return Fail(ErrorCode::kInvalidArgument, "layers are not valid UTF-8");
  }
}

Result<std::vector<std::string>> ParseLayers(const std::string& text, std::string_view owner) {
  json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
  std::vector<std::string> out;
  if (parsed.is_array()) {
    for (const json& item : parsed) {
      if (!item.is_string()) break;
      out.push_back(item.get<std::string>());
    }
    if (out.size() == parsed.size()) return out;
  }
  return Fail(ErrorCode::kInternal, std::string(owner) + ": layers is not an array of strings");
}

Result<TemplateRecord> ReadTemplate(const Statement& stmt) {
  TemplateRecord r;
  r.name = stmt.ColumnText(0);
  auto state = ParseTemplateState(stmt.ColumnText(1));
  if (!state) return std::unexpected(state.error());
  r.state = *state;
  r.source = stmt.ColumnText(2);
  r.spec = stmt.ColumnText(3);
  auto layers = ParseLayers(stmt.ColumnText(4), "template " + r.name);
  if (!layers) return std::unexpected(layers.error());
  r.layers = std::move(*layers);
  r.created_at_ms = stmt.ColumnInt(5);
  r.updated_at_ms = stmt.ColumnInt(6);
  r.error = stmt.ColumnText(7);
  r.tenant = stmt.ColumnText(8);
  return r;
}

}  // namespace

std::string_view TemplateStateName(TemplateState state) {
  switch (state) {
    case TemplateState::kBuilding:
      return "building";
    case TemplateState::kReady:
      return "ready";
    case TemplateState::kFailed:
      return "failed";
  }
  return "unknown";
}

Result<TemplateRecord> Store::InsertTemplate(TemplateRecord record) {
  if (auto st = ValidateTemplate(record); !st) return std::unexpected(st.error());
  auto layers = LayersJson(record.layers);
  if (!layers) return std::unexpected(layers.error());
  std::lock_guard lock(mu_);
  record.created_at_ms = record.updated_at_ms = options_.now_ms();
  auto stmt = db_.Prepare("INSERT INTO templates (" + std::string(kTemplateColumns) +
                          ") VALUES (?,?,?,?,?,?,?,?,?)");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, record.name)
      .Bind(2, TemplateStateName(record.state))
      .Bind(3, record.source)
      .Bind(4, record.spec)
      .Bind(5, *layers)
      .Bind(6, record.created_at_ms)
      .Bind(7, record.updated_at_ms)
      .Bind(8, record.error)
      .Bind(9, record.tenant);
  auto done = stmt->Run();
  if (!done) {
    if (done.error().code() == ErrorCode::kAlreadyExists) {
      return Fail(ErrorCode::kAlreadyExists, "template '" + record.name + "' already exists");
    }
    return std::unexpected(std::move(done.error()).Wrap("inserting template " + record.name));
  }
  return record;
}

Result<TemplateRecord> Store::GetTemplate(std::string_view name) {
  std::lock_guard lock(mu_);
  auto stmt = db_.Prepare("SELECT " + std::string(kTemplateColumns) +
                          " FROM templates WHERE name = ?");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, name);
  auto row = stmt->Step();
  if (!row) return std::unexpected(std::move(row.error()));
  if (!*row) return Fail(ErrorCode::kNotFound, "template '" + std::string(name) + "' does not exist");
  return ReadTemplate(*stmt);
}

Result<std::vector<TemplateRecord>> Store::ListTemplates() {
  std::lock_guard lock(mu_);
  auto stmt = db_.Prepare("SELECT " + std::string(kTemplateColumns) +
                          " FROM templates ORDER BY name");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  std::vector<TemplateRecord> out;
  while (true) {
    auto row = stmt->Step();
    if (!row) return std::unexpected(std::move(row.error()).Wrap("listing templates"));
    if (!*row) break;
    auto record = ReadTemplate(*stmt);
    if (!record) return std::unexpected(record.error());
    out.push_back(std::move(*record));
  }
  return out;
}

Result<TemplateRecord> Store::UpdateTemplate(const TemplateRecord& record) {
  if (auto st = ValidateTemplate(record); !st) return std::unexpected(st.error());
  auto layers = LayersJson(record.layers);
  if (!layers) return std::unexpected(layers.error());
  std::lock_guard lock(mu_);
  TemplateRecord updated = record;
  updated.updated_at_ms = options_.now_ms();
  auto stmt = db_.Prepare(
      "UPDATE templates SET state = ?2, spec = ?3, layers = ?4, updated_at_ms = ?5, error = ?6 "
      "WHERE name = ?1");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  stmt->Bind(1, updated.name)
      .Bind(2, TemplateStateName(updated.state))
      .Bind(3, updated.spec)
      .Bind(4, *layers)
      .Bind(5, updated.updated_at_ms)
      .Bind(6, updated.error);
  auto done = stmt->Run();
  if (!done) return std::unexpected(std::move(done.error()).Wrap("updating template " + record.name));
  if (db_.Changes() != 1) {
    return Fail(ErrorCode::kNotFound, "template '" + record.name + "' does not exist");
  }
  return updated;
}

Status Store::DeleteTemplate(std::string_view name) {
  std::lock_guard lock(mu_);
  auto tx = Transaction::Begin(db_);
  if (!tx) return std::unexpected(std::move(tx.error()));
  auto state = db_.Prepare("SELECT state FROM templates WHERE name = ?");
  if (!state) return std::unexpected(std::move(state.error()));
  state->Bind(1, name);
  auto row = state->Step();
  if (!row) return std::unexpected(std::move(row.error()));
  if (!*row) return Fail(ErrorCode::kNotFound, "template '" + std::string(name) + "' does not exist");
  if (state->ColumnText(0) == "building") {
    return Fail(ErrorCode::kFailedPrecondition,
                "template '" + std::string(name) + "' is building; delete it when the build ends");
  }
  auto users = db_.Prepare(
      "SELECT count(*), min(id) FROM sandboxes WHERE template_name = ? "
      "AND state NOT IN ('destroyed', 'failed')");
  if (!users) return std::unexpected(std::move(users.error()));
  users->Bind(1, name);
  auto counted = users->Step();
  if (!counted) return std::unexpected(std::move(counted.error()));
  if (int64_t n = users->ColumnInt(0); n > 0) {
    return Fail(ErrorCode::kFailedPrecondition,
                "template '" + std::string(name) + "' is in use by " + std::to_string(n) +
                    " sandbox(es), " + users->ColumnText(1) +
                    " among them (pooled ones count: set its pool size to 0 first)");
  }
  auto del = db_.Prepare("DELETE FROM templates WHERE name = ?");
  if (!del) return std::unexpected(std::move(del.error()));
  del->Bind(1, name);
  if (auto done = del->Run(); !done) return std::unexpected(std::move(done.error()));
  auto pool = db_.Prepare("DELETE FROM pools WHERE template_name = ?");
  if (!pool) return std::unexpected(std::move(pool.error()));
  pool->Bind(1, name);
  if (auto done = pool->Run(); !done) return std::unexpected(std::move(done.error()));
  return tx->Commit();
}

Result<std::set<std::string>> Store::LayersInUse() {
  std::lock_guard lock(mu_);
  auto stmt = db_.Prepare(
      "SELECT DISTINCT j.value FROM templates, json_each(templates.layers) AS j "
      "UNION SELECT DISTINCT j.value FROM sandboxes, json_each(sandboxes.layers) AS j "
      "WHERE sandboxes.state NOT IN ('destroyed', 'failed')");
  if (!stmt) return std::unexpected(std::move(stmt.error()));
  std::set<std::string> out;
  while (true) {
    auto row = stmt->Step();
    if (!row) return std::unexpected(std::move(row.error()).Wrap("listing layers in use"));
    if (!*row) break;
    out.insert(stmt->ColumnText(0));
  }
  return out;
}

}  // namespace airlock::store
