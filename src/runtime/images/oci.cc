#include "runtime/images/oci.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/syscall.h"
#include "common/unique_fd.h"
#include "runtime/images/layer_tar.h"
#include "common/sha256.h"

namespace airlock::images {
namespace {

using json = nlohmann::json;

// Index, manifests and configs are read whole; real ones are a few KiB.
constexpr size_t kMaxJsonBytes = 4 << 20;
// An index may name an index (multi-platform images); deeper than this is not an image.
constexpr int kMaxIndexDepth = 4;
// Links between the archive's own members (docker save links a layer it wrote already).
constexpr int kMaxLinkHops = 8;

#if defined(__aarch64__)
constexpr std::string_view kArchitecture = "arm64";
#else
constexpr std::string_view kArchitecture = "amd64";
#endif

constexpr std::string_view kIndexTypes[] = {
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
};
constexpr std::string_view kConfigTypes[] = {
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
};
// Whatever the type says, the reader detects the compression itself.
constexpr std::string_view kLayerTypes[] = {
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
};

template <size_t N>
bool OneOf(std::string_view value, const std::string_view (&set)[N]) {
  for (std::string_view s : set) {
    if (value == s) return true;
  }
  return false;
}

std::unexpected<Error> Invalid(std::string message) {
  return Fail(ErrorCode::kInvalidArgument, std::move(message));
}

bool IsHex64(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// "sha256:0123456789ab…": enough to tell layers apart in a message.
std::string ShortDigest(std::string_view digest) {
  return std::string(digest.substr(0, 19)) + (digest.size() > 19 ? "…" : "");
}

// ---------------------------------------------------------------------------------------------
// JSON without exceptions: every field's type is checked before it is read.

// The member `key` of `obj`, or nullptr if `obj` is no object or the member is absent or null.
const json* Field(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

Result<std::string> OptionalString(const json& obj, const char* key, std::string_view what) {
  const json* v = Field(obj, key);
  if (!v) return std::string();
  if (!v->is_string()) return Invalid(std::string(what) + "." + key + " is not a string");
  return v->get<std::string>();
}

Result<json> ParseJson(const std::string& text, std::string_view what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Invalid(std::string(what) + " is not valid JSON");
  return j;
}

Result<std::string> ReadSmall(int fd, std::string_view what) {
  struct stat st;
  if (::fstat(fd, &st) < 0) return FailErrno("stat " + std::string(what), errno);
  if (static_cast<uint64_t>(st.st_size) > kMaxJsonBytes) {
    return Fail(ErrorCode::kTooLarge, std::string(what) + " is larger than " +
                                          std::to_string(kMaxJsonBytes >> 20) + " MiB");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  auto n = ReadFull(fd, std::as_writable_bytes(std::span(text.data(), text.size())));
  if (!n) return std::unexpected(n.error().Wrap("reading " + std::string(what)));
  text.resize(*n);
  return text;
}

// A content descriptor: what an index or manifest says about a blob.
struct Descriptor {
  std::string media_type;  // "" if not given
  std::string digest;      // "sha256:<hex>"
  std::string hex;
  std::optional<uint64_t> size;
};

Result<Descriptor> ParseDescriptor(const json& j) {
  if (!j.is_object()) return Invalid("a descriptor is not a JSON object");
  Descriptor d;
  auto media_type = OptionalString(j, "mediaType", "the descriptor");
  if (!media_type) return std::unexpected(media_type.error());
  d.media_type = std::move(*media_type);
  const json* digest = Field(j, "digest");
  if (!digest || !digest->is_string()) return Invalid("a descriptor has no digest");
  d.digest = digest->get<std::string>();
  // Only sha256 (what every image tool writes); the hex becomes a file name, so nothing else
  // may pass.
  if (!d.digest.starts_with("sha256:") || !IsHex64(std::string_view(d.digest).substr(7))) {
    return Invalid("digest " + Quote(d.digest) + " is not sha256:<64 hex digits>");
  }
  d.hex = d.digest.substr(7);
  if (const json* size = Field(j, "size")) {
    if (!size->is_number_unsigned()) return Invalid("the size of " + d.digest + " is not a size");
    d.size = size->get<uint64_t>();
  }
  return d;
}

// ---------------------------------------------------------------------------------------------
// The outer archive, unpacked into a private staging directory.

// Its members' names are checked like a layer's; it may hold only files, directories and links
// between its own members. The links are never made on disk: they are kept here and followed
// by name, so the staging directory holds no symlink at all.
class Staging {
 public:
  explicit Staging(int dir) : dir_(dir) {}

  [[nodiscard]] Status Extract(int archive_fd, const UnpackLimits& limits) {
    auto reader = OpenTarReader(archive_fd);
    if (!reader) return std::unexpected(reader.error().Wrap("reading the image archive"));
    Budget budget(limits, "the image archive");
    for (;;) {
      archive_entry* entry;
      int r = archive_read_next_header(reader->get(), &entry);
      if (r == ARCHIVE_EOF) break;
      if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
        const char* message = archive_error_string(reader->get());
        return Invalid("reading the image archive: " +
                       std::string(message ? message : "unknown error"));
      }
      if (auto st = budget.AddEntry(); !st) return st;
      // Whatever the member's type: skipping its data still decompresses it.
      if (const int64_t size = archive_entry_size(entry); size > 0) {
        if (auto st = budget.AddBytes(static_cast<uint64_t>(size)); !st) return st;
      }
      const char* raw_name = archive_entry_pathname(entry);
      if (!raw_name) return Invalid("the image archive has a member without a name");
      auto name = CleanName(raw_name);
      Status added =
          name ? AddMember(reader->get(), entry, *name) : Status(std::unexpected(name.error()));
      if (!added) return std::unexpected(added.error().Wrap("member " + Quote(raw_name)));
    }
    return {};
  }

  // The regular file `path` of the archive, links between members followed.
  [[nodiscard]] Result<UniqueFd> Open(const std::string& path) const {
    std::string at = path;
    for (int hops = 0;; ++hops) {
      auto link = links_.find(at);
      if (link == links_.end()) break;
      if (hops == kMaxLinkHops) return Invalid(Quote(path) + " is a loop of links");
      at = link->second;
    }
    const auto [dir, base] = SplitParent(at);
    auto parent = OpenDirBeneath(dir_, dir, /*create=*/false);
    UniqueFd fd;
    if (parent && !base.empty()) {
      fd.Reset(::openat(parent->get(), base.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    }
    struct stat st;
    if (!fd || ::fstat(fd.get(), &st) < 0 || !S_ISREG(st.st_mode)) {
      return Invalid(Quote(path) + " is not in the image archive");
    }
    return fd;
  }

  bool Has(const std::string& path) const { return Open(path).has_value(); }

 private:
  Status AddMember(archive* a, archive_entry* entry, const std::string& name) {
    if (name.empty()) return {};  // "./": the archive's root
    const auto [dir, base] = SplitParent(name);
    if (const char* target = archive_entry_hardlink(entry)) {
      auto clean = CleanName(target);
      if (!clean) return std::unexpected(clean.error().Wrap("its link target " + Quote(target)));
      links_[name] = *clean;
      return {};
    }
    switch (archive_entry_filetype(entry)) {
      case AE_IFDIR: {
        auto fd = OpenDirBeneath(dir_, name, /*create=*/true);
        if (!fd) return std::unexpected(fd.error());
        return {};
      }
      case AE_IFREG: {
        auto parent = OpenDirBeneath(dir_, dir, /*create=*/true);
        if (!parent) return std::unexpected(parent.error());
        const int64_t size = archive_entry_size(entry);
        if (size < 0) return Invalid("a negative size");
        UniqueFd fd(::openat(parent->get(), base.c_str(),
                             O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        if (!fd) {
          if (errno == EEXIST) return Invalid("the name appears twice");
          return FailErrno("creating it", errno);
        }
        return WriteEntryData(a, fd.get(), static_cast<uint64_t>(size));
      }
      case AE_IFLNK: {
        const char* target = archive_entry_symlink(entry);
        if (!target || !*target) return Invalid("a symlink without a target");
        auto resolved = ResolveRelative(dir, target);
        if (!resolved) return std::unexpected(resolved.error());
        links_[name] = *resolved;
        return {};
      }
      default:
        return Invalid("not a file, directory or link (an image archive holds nothing else)");
    }
  }

  // A symlink's target, relative to the link's directory, as a path from the archive's root.
  // ".." may climb within the archive, never out of it.
  static Result<std::string> ResolveRelative(const std::string& dir, std::string_view target) {
    if (target.starts_with('/')) return Invalid("a symlink to an absolute path " + Quote(target));
    std::vector<std::string> parts;
    const std::string joined = dir.empty() ? std::string(target) : dir + "/" + std::string(target);
    for (size_t at = 0; at < joined.size();) {
      size_t slash = std::min(joined.find('/', at), joined.size());
      std::string component = joined.substr(at, slash - at);
      at = slash + 1;
      if (component.empty() || component == ".") continue;
      if (component == "..") {
        if (parts.empty()) return Invalid("a symlink out of the archive " + Quote(target));
        parts.pop_back();
        continue;
      }
      parts.push_back(std::move(component));
    }
    std::string out;
    for (const std::string& part : parts) out += (out.empty() ? "" : "/") + part;
    auto clean = CleanName(out);  // depth and component length
    if (!clean) return std::unexpected(clean.error().Wrap("its link target " + Quote(target)));
    return clean;
  }

  int dir_;
  std::map<std::string, std::string> links_;  // member -> the member it links to
};

Result<json> ReadStagedJson(const Staging& staging, const std::string& path) {
  auto fd = staging.Open(path);
  if (!fd) return std::unexpected(fd.error());
  auto text = ReadSmall(fd->get(), path);
  if (!text) return std::unexpected(text.error());
  return ParseJson(*text, path);
}

// The blob a descriptor names, its size and digest checked. Returned at offset 0.
Result<UniqueFd> OpenBlob(const Staging& staging, const Descriptor& d) {
  auto fd = staging.Open("blobs/sha256/" + d.hex);
  if (!fd) return Invalid("blob " + d.digest + " is not in the image archive");
  struct stat st;
  if (::fstat(fd->get(), &st) < 0) return FailErrno("stat blob " + d.digest, errno);
  if (d.size && static_cast<uint64_t>(st.st_size) != *d.size) {
    return Invalid("blob " + d.digest + " is " + std::to_string(st.st_size) +
                   " bytes, its descriptor says " + std::to_string(*d.size));
  }
  Sha256 hash;
  std::string buf(1 << 17, '\0');
  for (;;) {
    ssize_t n = RetryEintr([&] { return ::read(fd->get(), buf.data(), buf.size()); });
    if (n < 0) return FailErrno("reading blob " + d.digest, errno);
    if (n == 0) break;
    hash.Update(buf.data(), static_cast<size_t>(n));
  }
  if (std::string actual = hash.Hex(); actual != d.hex) {
    return Invalid("blob " + d.digest +
                   " does not match its digest (its content is sha256:" + actual + ")");
  }
  if (::lseek(fd->get(), 0, SEEK_SET) < 0) return FailErrno("seeking in blob " + d.digest, errno);
  return fd;
}

Result<json> ReadBlobJson(const Staging& staging, const Descriptor& d) {
  auto fd = OpenBlob(staging, d);
  if (!fd) return std::unexpected(fd.error());
  auto text = ReadSmall(fd->get(), d.digest);
  if (!text) return std::unexpected(text.error());
  return ParseJson(*text, "blob " + d.digest);
}

// The image config: what a sandbox uses of it, and the layers' uncompressed digests.
Result<ImageConfig> ParseConfig(const json& j, std::vector<std::string>& diff_ids) {
  if (!j.is_object()) return Invalid("the image config is not a JSON object");
  ImageConfig out;
  if (const json* config = Field(j, "config")) {
    if (!config->is_object()) return Invalid("the image config's config is not an object");
    if (const json* env = Field(*config, "Env")) {
      if (!env->is_array()) return Invalid("config.Env is not an array");
      for (const json& item : *env) {
        if (!item.is_string()) return Invalid("config.Env holds something that is not a string");
        out.env.push_back(item.get<std::string>());
      }
    }
    auto workdir = OptionalString(*config, "WorkingDir", "config");
    if (!workdir) return std::unexpected(workdir.error());
    out.workdir = std::move(*workdir);
    auto user = OptionalString(*config, "User", "config");
    if (!user) return std::unexpected(user.error());
    out.user = std::move(*user);
  }
  const json* rootfs = Field(j, "rootfs");
  const json* ids = rootfs ? Field(*rootfs, "diff_ids") : nullptr;
  if (!ids || !ids->is_array()) return Invalid("the image config has no rootfs.diff_ids");
  for (const json& id : *ids) {
    if (!id.is_string()) return Invalid("rootfs.diff_ids holds something that is not a string");
    diff_ids.push_back(id.get<std::string>());
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// OCI image layout: oci-layout, index.json, blobs/sha256/<hex>.

bool IsIndex(const Descriptor& d, const json& j) {
  std::string type = d.media_type;
  if (type.empty()) type = OptionalString(j, "mediaType", "").value_or("");
  if (!type.empty()) return OneOf(type, kIndexTypes);
  const json* manifests = Field(j, "manifests");
  return manifests && manifests->is_array() && !Field(j, "layers");
}

// The manifest for this host's platform (linux/amd64 on x86-64), else the first.
Result<Descriptor> PickManifest(const json& index) {
  const json* manifests = Field(index, "manifests");
  if (!manifests || !manifests->is_array() || manifests->empty()) {
    return Invalid("the image index lists no manifests");
  }
  for (const json& m : *manifests) {
    const json* platform = Field(m, "platform");
    if (platform && OptionalString(*platform, "os", "").value_or("") == "linux" &&
        OptionalString(*platform, "architecture", "").value_or("") == kArchitecture) {
      return ParseDescriptor(m);
    }
  }
  return ParseDescriptor((*manifests)[0]);
}

Result<ImageConfig> UnpackOci(const Staging& staging, LayerApplier& applier) {
  auto layout = ReadStagedJson(staging, "oci-layout");
  if (!layout) return std::unexpected(layout.error());
  if (!Field(*layout, "imageLayoutVersion")) return Invalid("oci-layout has no imageLayoutVersion");
  auto index = ReadStagedJson(staging, "index.json");
  if (!index) return std::unexpected(index.error());
  const json* listed = Field(*index, "manifests");
  if (!listed || !listed->is_array() || listed->empty()) {
    return Invalid("index.json lists no manifests");
  }
  auto descriptor = ParseDescriptor((*listed)[0]);
  if (!descriptor) return std::unexpected(descriptor.error().Wrap("index.json: manifests[0]"));

  json manifest;
  for (int depth = 0;; ++depth) {
    if (depth == kMaxIndexDepth) {
      return Invalid("image indexes nest deeper than " + std::to_string(kMaxIndexDepth));
    }
    auto j = ReadBlobJson(staging, *descriptor);
    if (!j) return std::unexpected(j.error());
    if (!IsIndex(*descriptor, *j)) {
      manifest = std::move(*j);
      break;
    }
    auto picked = PickManifest(*j);
    if (!picked) return std::unexpected(picked.error().Wrap("image index " + descriptor->digest));
    descriptor = std::move(picked);
  }
  const std::string what = "manifest " + descriptor->digest;
  const json* config_field = Field(manifest, "config");
  const json* layers = Field(manifest, "layers");
  if (!config_field || !layers || !layers->is_array()) {
    return Invalid(what + " has no config or no layers");
  }
  auto config_descriptor = ParseDescriptor(*config_field);
  if (!config_descriptor) return std::unexpected(config_descriptor.error().Wrap(what + ": config"));
  if (!config_descriptor->media_type.empty() &&
      !OneOf(config_descriptor->media_type, kConfigTypes)) {
    return Invalid(what + " is not a container image (its config is " +
                   Quote(config_descriptor->media_type) + ")");
  }
  auto config_json = ReadBlobJson(staging, *config_descriptor);
  if (!config_json) return std::unexpected(config_json.error());
  std::vector<std::string> diff_ids;
  auto config = ParseConfig(*config_json, diff_ids);
  if (!config) return std::unexpected(config.error().Wrap("config " + config_descriptor->digest));
  if (diff_ids.size() != layers->size()) {
    return Invalid("the config lists " + std::to_string(diff_ids.size()) + " layers, " + what +
                   " " + std::to_string(layers->size()));
  }

  const size_t count = layers->size();
  for (size_t i = 0; i < count; ++i) {
    auto layer = ParseDescriptor((*layers)[i]);
    std::string label = "layer " + std::to_string(i + 1) + " of " + std::to_string(count);
    if (!layer) return std::unexpected(layer.error().Wrap(label));
    label += " (" + ShortDigest(layer->digest) + ")";
    if (!layer->media_type.empty() && !OneOf(layer->media_type, kLayerTypes)) {
      return Invalid(label + ": unsupported media type " + Quote(layer->media_type));
    }
    auto fd = OpenBlob(staging, *layer);
    if (!fd) return std::unexpected(fd.error().Wrap(label));
    if (auto st = applier.Apply(fd->get(), diff_ids[i]); !st) {
      return std::unexpected(st.error().Wrap(label));
    }
  }
  config->digest = descriptor->digest;
  return config;
}

// ---------------------------------------------------------------------------------------------
// docker save: manifest.json = [{"Config": "<file>", "RepoTags": [...], "Layers": [...]}].

Result<ImageConfig> UnpackDockerSave(const Staging& staging, LayerApplier& applier) {
  auto manifest = ReadStagedJson(staging, "manifest.json");
  if (!manifest) return std::unexpected(manifest.error());
  if (!manifest->is_array() || manifest->empty()) return Invalid("manifest.json lists no image");
  const json& image = (*manifest)[0];
  const json* config_name = Field(image, "Config");
  const json* layers = Field(image, "Layers");
  if (!config_name || !config_name->is_string() || !layers || !layers->is_array()) {
    return Invalid("manifest.json: the first image has no Config or no Layers");
  }
  const std::string raw_config = config_name->get<std::string>();
  auto config_path = CleanName(raw_config);
  if (!config_path) {
    return std::unexpected(config_path.error().Wrap("manifest.json: Config " + Quote(raw_config)));
  }
  auto config_fd = staging.Open(*config_path);
  if (!config_fd) return std::unexpected(config_fd.error());
  auto config_text = ReadSmall(config_fd->get(), *config_path);
  if (!config_text) return std::unexpected(config_text.error());
  Sha256 hash;
  hash.Update(*config_text);
  const std::string config_hex = hash.Hex();
  // The config is named by its digest ("<hex>.json", or "blobs/sha256/<hex>" since Docker 25):
  // the one thing in the archive that checks it and, through its diff ids, the layers.
  std::string named = SplitParent(*config_path).second;
  if (named.ends_with(".json")) named.resize(named.size() - 5);
  if (IsHex64(named) && named != config_hex) {
    return Invalid("config " + Quote(*config_path) + " does not match its name (its content is " +
                   "sha256:" + config_hex + ")");
  }
  auto parsed = ParseJson(*config_text, *config_path);
  if (!parsed) return std::unexpected(parsed.error());
  std::vector<std::string> diff_ids;
  auto config = ParseConfig(*parsed, diff_ids);
  if (!config) return std::unexpected(config.error().Wrap("config " + Quote(*config_path)));
  if (diff_ids.size() != layers->size()) {
    return Invalid("the config lists " + std::to_string(diff_ids.size()) +
                   " layers, manifest.json " + std::to_string(layers->size()));
  }

  const size_t count = layers->size();
  for (size_t i = 0; i < count; ++i) {
    std::string label = "layer " + std::to_string(i + 1) + " of " + std::to_string(count);
    const json& entry = (*layers)[i];
    if (!entry.is_string()) return Invalid(label + ": not a file name");
    const std::string raw_path = entry.get<std::string>();
    label += " (" + Quote(raw_path) + ")";
    auto path = CleanName(raw_path);
    if (!path) return std::unexpected(path.error().Wrap(label));
    auto fd = staging.Open(*path);
    if (!fd) return std::unexpected(fd.error().Wrap(label));
    if (auto st = applier.Apply(fd->get(), diff_ids[i]); !st) {
      return std::unexpected(st.error().Wrap(label));
    }
  }
  config->digest = "sha256:" + config_hex;
  return config;
}

Result<ImageConfig> Unpack(int archive_fd, int staging_dir, int root, const UnpackLimits& limits) {
  Staging staging(staging_dir);
  if (auto st = staging.Extract(archive_fd, limits); !st) return std::unexpected(st.error());
  LayerApplier applier(root, limits);
  Result<ImageConfig> config;
  // Newer docker save writes both; the OCI index is the one with a digest for every blob.
  if (staging.Has("oci-layout") && staging.Has("index.json")) {
    config = UnpackOci(staging, applier);
  } else if (staging.Has("manifest.json")) {
    config = UnpackDockerSave(staging, applier);
  } else {
    return Invalid(
        "neither an OCI image layout (oci-layout, index.json) nor a docker save archive "
        "(manifest.json)");
  }
  if (!config) return config;
  if (auto st = applier.Finish(); !st) return std::unexpected(st.error());
  return config;
}

bool IsEmptyDir(int dir) {
  int fd = ::openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  DIR* listing = ::fdopendir(fd);
  if (!listing) {
    ::close(fd);
    return false;
  }
  bool empty = true;
  while (dirent* e = ::readdir(listing)) {
    std::string_view name = e->d_name;
    if (name != "." && name != "..") {
      empty = false;
      break;
    }
  }
  ::closedir(listing);
  return empty;
}

}  // namespace

Result<ImageConfig> UnpackImage(const std::string& archive, const std::string& dest,
                                const UnpackLimits& limits) {
  UniqueFd archive_fd(::open(archive.c_str(), O_RDONLY | O_NOCTTY | O_CLOEXEC));
  if (!archive_fd) {
    if (errno == ENOENT) {
      return Fail(ErrorCode::kNotFound, "image archive " + archive + " not found");
    }
    return FailErrno("opening image archive " + archive, errno);
  }
  struct stat st;
  if (::fstat(archive_fd.get(), &st) < 0) return FailErrno("stat " + archive, errno);
  if (!S_ISREG(st.st_mode)) return Invalid("image archive " + archive + " is not a file");

  std::string base = dest;
  while (base.size() > 1 && base.ends_with('/')) base.pop_back();
  if (base.empty() || base == "/") return Invalid("cannot unpack an image into '" + dest + "'");
  UniqueFd root(::open(base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root) {
    if (errno == ENOENT) return Fail(ErrorCode::kNotFound, "directory " + dest + " not found");
    return FailErrno("opening " + dest, errno);
  }
  if (!IsEmptyDir(root.get())) {
    return Fail(ErrorCode::kFailedPrecondition, "directory " + dest + " is not empty");
  }

  // The staging directory sits next to dest (same file system, same owner's care), and only
  // this call uses the name: what a crash left there is removed first.
  const size_t slash = base.rfind('/');
  const std::string parent_path =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : base.substr(0, slash));
  const std::string staging_name =
      (slash == std::string::npos ? base : base.substr(slash + 1)) + ".image";
  UniqueFd parent(::open(parent_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!parent) return FailErrno("opening " + parent_path, errno);
  if (auto removed = RemoveTreeAt(parent.get(), staging_name); !removed) {
    return std::unexpected(removed.error().Wrap("removing a stale " + staging_name));
  }
  if (::mkdirat(parent.get(), staging_name.c_str(), 0700) < 0) {
    return FailErrno("mkdir " + parent_path + "/" + staging_name, errno);
  }
  ScopeExit remove_staging([&] { (void)RemoveTreeAt(parent.get(), staging_name); });
  UniqueFd staging(::openat(parent.get(), staging_name.c_str(),
                            O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!staging) return FailErrno("opening " + staging_name, errno);

  auto config = Unpack(archive_fd.get(), staging.get(), root.get(), limits);
  if (!config) {
    // Half an image is no image: the caller gets dest back empty.
    (void)RemoveChildren(root.get());
    return config;
  }
  return config;
}

}  // namespace airlock::images
