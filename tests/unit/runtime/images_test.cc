// Image archives: OCI layouts and docker save tars built here with libarchive's writer, unpacked
// into a temp dir. The hostile cases each try one escape and check that it failed with
// kInvalidArgument, that the canaries outside the destination are untouched, that nothing new
// appeared outside it, and that the destination was left empty.
//
// The unpacker sets the owners the layers name, so the tests need root (skipped otherwise, with
// the reason printed).

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <locale.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/sha256.h"
#include "common/syscall.h"
#include "common/unique_fd.h"
#include "runtime/images/oci.h"

namespace airlock::images {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kLayerTar[] = "application/vnd.oci.image.layer.v1.tar";
constexpr char kLayerGzip[] = "application/vnd.oci.image.layer.v1.tar+gzip";
constexpr char kLayerZstd[] = "application/vnd.oci.image.layer.v1.tar+zstd";
constexpr char kManifestType[] = "application/vnd.oci.image.manifest.v1+json";
constexpr char kIndexType[] = "application/vnd.oci.image.index.v1+json";
constexpr char kConfigType[] = "application/vnd.oci.image.config.v1+json";
constexpr time_t kMtime = 1'600'000'000;

// ---------------------------------------------------------------------------------------------
// Building archives

// One tar entry. type: 'f' file, 'd' directory, 'l' symlink (link = target), 'h' hard link
// (link = the path it links to), 'c' character device, 'p' fifo.
struct Entry {
  std::string name;
  char type = 'f';
  std::string data;
  std::string link;
  unsigned mode = 0644;
  int64_t uid = 0;
  int64_t gid = 0;
};

Entry File(std::string name, std::string data, unsigned mode = 0644) {
  return Entry{std::move(name), 'f', std::move(data), "", mode};
}
Entry Dir(std::string name, unsigned mode = 0755) {
  return Entry{std::move(name), 'd', "", "", mode};
}
Entry Symlink(std::string name, std::string target) {
  return Entry{std::move(name), 'l', "", std::move(target), 0777};
}
Entry HardLink(std::string name, std::string target) {
  return Entry{std::move(name), 'h', "", std::move(target), 0644};
}

enum class Compression { kNone, kGzip, kZstd };

la_ssize_t AppendToString(archive*, void* out, const void* data, size_t size) {
  static_cast<std::string*>(out)->append(static_cast<const char*>(data), size);
  return static_cast<la_ssize_t>(size);
}

// Writes with libarchive's writer; `raw` writes `raw_data` alone (to compress bytes).
std::string Write(const std::vector<Entry>& entries, Compression compression,
                  const std::string* raw_data = nullptr) {
  // Names are UTF-8 and go into pax records as UTF-8, as Go's archive/tar writes them. The
  // writer converts from the thread's locale, so it gets a UTF-8 one; the unpacker runs in the
  // test's own (C) locale, as in the daemon.
  locale_t utf8 = ::newlocale(LC_CTYPE_MASK, "C.UTF-8", nullptr);
  locale_t previous = utf8 ? ::uselocale(utf8) : nullptr;
  ScopeExit restore([&] {
    if (!utf8) return;
    ::uselocale(previous);
    ::freelocale(utf8);
  });
  std::string out;
  archive* a = archive_write_new();
  if (raw_data) {
    archive_write_set_format_raw(a);
  } else {
    archive_write_set_format_pax_restricted(a);
  }
  if (compression == Compression::kGzip) archive_write_add_filter_gzip(a);
  if (compression == Compression::kZstd) archive_write_add_filter_zstd(a);
  archive_write_set_bytes_in_last_block(a, 1);
  EXPECT_EQ(archive_write_open(a, &out, nullptr, &AppendToString, nullptr), ARCHIVE_OK)
      << archive_error_string(a);
  auto write_one = [&](const Entry& e) {
    archive_entry* entry = archive_entry_new();
    archive_entry_set_pathname(entry, e.name.c_str());
    archive_entry_set_uid(entry, e.uid);
    archive_entry_set_gid(entry, e.gid);
    archive_entry_set_mtime(entry, kMtime, 0);
    archive_entry_set_perm(entry, e.mode);
    switch (e.type) {
      case 'f':
        archive_entry_set_filetype(entry, AE_IFREG);
        archive_entry_set_size(entry, static_cast<la_int64_t>(e.data.size()));
        break;
      case 'd':
        archive_entry_set_filetype(entry, AE_IFDIR);
        break;
      case 'l':
        archive_entry_set_filetype(entry, AE_IFLNK);
        archive_entry_set_symlink(entry, e.link.c_str());
        break;
      case 'h':
        archive_entry_set_filetype(entry, AE_IFREG);
        archive_entry_set_hardlink(entry, e.link.c_str());
        archive_entry_set_size(entry, 0);
        break;
      case 'c':
        archive_entry_set_filetype(entry, AE_IFCHR);
        archive_entry_set_rdev(entry, makedev(1, 3));
        break;
      case 'p':
        archive_entry_set_filetype(entry, AE_IFIFO);
        break;
    }
    EXPECT_EQ(archive_write_header(a, entry), ARCHIVE_OK) << archive_error_string(a);
    if (e.type == 'f' && !e.data.empty()) {
      EXPECT_EQ(archive_write_data(a, e.data.data(), e.data.size()),
                static_cast<la_ssize_t>(e.data.size()));
    }
    archive_entry_free(entry);
  };
  if (raw_data) {
    write_one(File("data", *raw_data));
  } else {
    for (const Entry& e : entries) write_one(e);
  }
  EXPECT_EQ(archive_write_close(a), ARCHIVE_OK) << archive_error_string(a);
  archive_write_free(a);
  return out;
}

std::string Tar(const std::vector<Entry>& entries) { return Write(entries, Compression::kNone); }

std::string Compress(const std::string& data, Compression compression) {
  if (compression == Compression::kNone) return data;
  return Write({}, compression, &data);
}

json Descriptor(const std::string& media_type, const std::string& blob) {
  return {
      {"mediaType", media_type}, {"digest", "sha256:" + Sha256::Of(blob)}, {"size", blob.size()}};
}

// An OCI image layout: blobs added one by one, then the outer tar. Tests change `members`
// before Archive() to break it on purpose.
class OciBuilder {
 public:
  // Adds a layer (compressed as asked) and returns its descriptor; its diff id is recorded for
  // the config.
  json Layer(const std::vector<Entry>& entries, Compression compression = Compression::kNone) {
    const std::string tar = Tar(entries);
    diff_ids_.push_back("sha256:" + Sha256::Of(tar));
    const char* type = compression == Compression::kGzip   ? kLayerGzip
                       : compression == Compression::kZstd ? kLayerZstd
                                                           : kLayerTar;
    return Blob(Compress(tar, compression), type);
  }

  json Blob(const std::string& data, const std::string& media_type) {
    members["blobs/sha256/" + Sha256::Of(data)] = data;
    return Descriptor(media_type, data);
  }

  json Config(const json& config = {{"Env", {"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}},
                                    {"WorkingDir", "/app"},
                                    {"User", "1000:1000"}}) {
    json j = {{"architecture", "amd64"},
              {"os", "linux"},
              {"config", config},
              {"rootfs", {{"type", "layers"}, {"diff_ids", diff_ids_}}}};
    return Blob(j.dump(), kConfigType);
  }

  json Manifest(const json& config, const std::vector<json>& layers) {
    json j = {
        {"schemaVersion", 2}, {"mediaType", kManifestType}, {"config", config}, {"layers", layers}};
    return Blob(j.dump(), kManifestType);
  }

  std::string Archive(const std::vector<json>& index_manifests) {
    members["oci-layout"] = R"({"imageLayoutVersion":"1.0.0"})";
    members["index.json"] =
        json{{"schemaVersion", 2}, {"mediaType", kIndexType}, {"manifests", index_manifests}}
            .dump();
    std::vector<Entry> entries = {Dir("blobs"), Dir("blobs/sha256")};
    for (const auto& [name, data] : members) entries.push_back(File(name, data));
    for (const Entry& e : extra) entries.push_back(e);
    return Tar(entries);
  }

  // The whole image in one go: these layers (and no others), the default config.
  std::string Image(const std::vector<std::vector<Entry>>& layers,
                    Compression compression = Compression::kNone) {
    diff_ids_.clear();
    std::vector<json> descriptors;
    for (const auto& layer : layers) descriptors.push_back(Layer(layer, compression));
    manifest = Manifest(Config(), descriptors);
    return Archive({manifest});
  }

  std::map<std::string, std::string> members;
  std::vector<Entry> extra;  // more members of the outer tar, after the others
  json manifest;             // the descriptor Image() made

 private:
  std::vector<std::string> diff_ids_;
};

// A docker save archive (legacy layout): <id>/layer.tar, <config hex>.json, manifest.json.
struct DockerSave {
  std::vector<Entry> members;
  std::string config_hex;

  explicit DockerSave(const std::vector<std::vector<Entry>>& layers,
                      const std::vector<std::string>& layer_paths = {}) {
    json diff_ids = json::array(), paths = json::array();
    for (size_t i = 0; i < layers.size(); ++i) {
      const std::string tar = Tar(layers[i]);
      diff_ids.push_back("sha256:" + Sha256::Of(tar));
      const std::string dir = "layer" + std::to_string(i);
      const std::string path = i < layer_paths.size() ? layer_paths[i] : dir + "/layer.tar";
      paths.push_back(path);
      members.push_back(Dir(dir));
      members.push_back(File(dir + "/layer.tar", tar));
    }
    const std::string config =
        json{{"architecture", "amd64"},
             {"os", "linux"},
             {"config", {{"Env", {"HOME=/root"}}, {"WorkingDir", "/srv"}, {"User", "nobody"}}},
             {"rootfs", {{"type", "layers"}, {"diff_ids", diff_ids}}}}
            .dump();
    config_hex = Sha256::Of(config);
    members.push_back(File(config_hex + ".json", config));
    members.push_back(File("manifest.json", json::array({{{"Config", config_hex + ".json"},
                                                          {"RepoTags", {"example:latest"}},
                                                          {"Layers", paths}}})
                                                .dump()));
  }
  std::string Archive() const { return Tar(members); }
};

// ---------------------------------------------------------------------------------------------
// Files

std::string Slurp(const std::string& path) {
  auto text = ReadFileToString(path);
  return text ? *text : "<unreadable: " + text.error().message() + ">";
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

struct stat Lstat(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st;
}

std::set<std::string> List(const std::string& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.insert(e.path().filename());
  return names;
}

// Every path under `dir`, relative, symlinks not followed.
std::set<std::string> Walk(const std::string& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); it != fs::end(it); it.increment(ec)) {
    names.insert(fs::relative(it->path(), dir).string());
  }
  return names;
}

class ImagesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: the unpacker sets the owners layers name";
    char tmpl[] = "/tmp/airlock-images-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    top_ = tmpl;
    dest_ = top_ + "/rootfs";
    outside_ = top_ + "/outside";
    ASSERT_EQ(::mkdir(dest_.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir(outside_.c_str(), 0755), 0);
    std::ofstream(top_ + "/canary") << "canary";
    std::ofstream(outside_ + "/canary") << "canary";
    passwd_links_ = Lstat("/etc/passwd").st_nlink;
    tmp_x_existed_ = Exists("/tmp/x");
  }
  void TearDown() override {
    if (top_.empty()) return;
    std::error_code ec;
    fs::remove_all(top_, ec);
  }

  Result<ImageConfig> Unpack(const std::string& archive, const UnpackLimits& limits = {}) {
    {
      std::ofstream out(top_ + "/image.tar", std::ios::binary | std::ios::trunc);
      out << archive;
    }
    return UnpackImage(top_ + "/image.tar", dest_, limits);
  }

  // After a refused archive: the failure was kInvalidArgument and said `expected`; nothing
  // outside dest changed or appeared; dest is empty and the staging directory gone.
  void ExpectRefused(const Result<ImageConfig>& result, const std::string& expected) {
    ASSERT_FALSE(result.has_value()) << "unpacked an archive that should have been refused";
    EXPECT_EQ(result.error().code(), ErrorCode::kInvalidArgument) << result.error().message();
    EXPECT_NE(result.error().message().find(expected), std::string::npos)
        << "message: " << result.error().message() << "\nexpected to contain: " << expected;
    ExpectNothingEscaped();
    EXPECT_TRUE(List(dest_).empty()) << "dest was not emptied";
  }

  void ExpectNothingEscaped() {
    EXPECT_EQ(List(top_), (std::set<std::string>{"canary", "image.tar", "outside", "rootfs"}));
    EXPECT_EQ(List(outside_), (std::set<std::string>{"canary"}));
    for (const std::string& canary : {top_ + "/canary", outside_ + "/canary"}) {
      EXPECT_EQ(Slurp(canary), "canary");
      EXPECT_EQ(Lstat(canary).st_nlink, 1u) << canary << " gained a hard link";
    }
    EXPECT_EQ(Lstat("/etc/passwd").st_nlink, passwd_links_) << "/etc/passwd gained a hard link";
    EXPECT_EQ(Exists("/tmp/x"), tmp_x_existed_);
  }

  std::string top_, dest_, outside_;
  nlink_t passwd_links_ = 0;
  bool tmp_x_existed_ = false;
};

// ---------------------------------------------------------------------------------------------
// Images that unpack

TEST_F(ImagesTest, OciLayersApplyInOrderWithWhiteoutsAndOpaqueDirectories) {
  OciBuilder oci;
  const std::string archive = [&] {
    std::vector<json> layers;
    layers.push_back(
        oci.Layer({Dir("etc"), File("etc/hosts", "127.0.0.1 localhost\n"),
                   File("etc/passwd", "root:x:0:0::/root:/bin/sh\n"), Dir("opt"), Dir("opt/old"),
                   File("opt/old/a", "a"), File("opt/old/b", "b"), Dir("keep"), Dir("keep/sub"),
                   File("keep/sub/x", "x"), File("replace-me", "v1")}));
    layers.push_back(oci.Layer({File("etc/.wh.hosts", ""), File("opt/old/.wh..wh..opq", ""),
                                File("opt/old/new", "new"), File("replace-me", "v2")},
                               Compression::kGzip));
    layers.push_back(
        oci.Layer({File(".wh.keep", ""), File("etc/motd", "hello\n")}, Compression::kZstd));
    oci.manifest = oci.Manifest(oci.Config(), layers);
    return oci.Archive({oci.manifest});
  }();
  auto config = Unpack(archive);
  ASSERT_TRUE(config.has_value()) << config.error().message();

  EXPECT_FALSE(Exists(dest_ + "/etc/hosts")) << "the whiteout .wh.hosts was not applied";
  EXPECT_EQ(Slurp(dest_ + "/etc/passwd"), "root:x:0:0::/root:/bin/sh\n");
  EXPECT_EQ(Slurp(dest_ + "/etc/motd"), "hello\n");
  EXPECT_EQ(List(dest_ + "/opt/old"), (std::set<std::string>{"new"})) << "opaque dir not applied";
  EXPECT_EQ(Slurp(dest_ + "/opt/old/new"), "new");
  EXPECT_FALSE(Exists(dest_ + "/keep")) << "a directory whited out was not removed";
  EXPECT_EQ(Slurp(dest_ + "/replace-me"), "v2");
  for (const std::string& path : Walk(dest_)) {
    EXPECT_EQ(path.find(".wh."), std::string::npos) << "whiteout extracted: " << path;
  }
  EXPECT_FALSE(Exists(dest_ + ".image")) << "the staging directory was left";

  EXPECT_EQ(config->env, (std::vector<std::string>{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}));
  EXPECT_EQ(config->workdir, "/app");
  EXPECT_EQ(config->user, "1000:1000");
  EXPECT_EQ(config->digest, oci.manifest["digest"].get<std::string>());
}

TEST_F(ImagesTest, KeepsOwnersModesLinksAndTimes) {
  Entry tool = File("bin/tool", "#!/bin/sh\n", 04755);
  tool.uid = 1000;
  tool.gid = 2000;
  Entry home = Dir("home/user", 0700);
  home.uid = 1000;
  home.gid = 1000;
  OciBuilder oci;
  auto config = Unpack(oci.Image({
      {Dir("bin"), tool, Dir("home"), home, Dir("usr"), Dir("usr/lib"),
       File("usr/lib/libc.so", "elf")},
      {HardLink("bin/tool2", "bin/tool"), Symlink("lib", "/usr/lib"),
       Symlink("bin/rel", "../usr/lib/libc.so"), Entry{"dev/null", 'c'}, Entry{"run/fifo", 'p'}},
  }));
  ASSERT_TRUE(config.has_value()) << config.error().message();

  struct stat st = Lstat(dest_ + "/bin/tool");
  EXPECT_EQ(st.st_uid, 1000u);
  EXPECT_EQ(st.st_gid, 2000u);
  EXPECT_EQ(st.st_mode & 07777, 04755u) << "set-user-ID is kept here (a later step drops it)";
  EXPECT_EQ(st.st_mtime, kMtime);
  struct stat link = Lstat(dest_ + "/bin/tool2");
  EXPECT_EQ(link.st_ino, st.st_ino) << "the hard link is a copy";
  EXPECT_EQ(st.st_nlink, 2u);

  struct stat home_st = Lstat(dest_ + "/home/user");
  EXPECT_TRUE(S_ISDIR(home_st.st_mode));
  EXPECT_EQ(home_st.st_mode & 07777, 0700u);
  EXPECT_EQ(home_st.st_uid, 1000u);
  EXPECT_EQ(Lstat(dest_ + "/usr/lib").st_mtime, kMtime) << "directory mtimes are restored last";

  EXPECT_TRUE(S_ISLNK(Lstat(dest_ + "/lib").st_mode));
  EXPECT_EQ(fs::read_symlink(dest_ + "/lib"), "/usr/lib") << "absolute targets stay as written";
  EXPECT_EQ(fs::read_symlink(dest_ + "/bin/rel"), "../usr/lib/libc.so");
  EXPECT_FALSE(Exists(dest_ + "/dev/null")) << "a device node was created";
  EXPECT_FALSE(Exists(dest_ + "/run/fifo")) << "a fifo was created";
}

TEST_F(ImagesTest, ReplacingAFileDoesNotWriteThroughItsHardLinks) {
  OciBuilder oci;
  auto config = Unpack(oci.Image({
      {File("a", "old"), HardLink("b", "a"), Dir("d"), File("d/inner", "x")},
      {File("a", "new"), File("d", "now a file"), Dir("f"), File("f/g", "g")},
      {File("f", "file again")},
  }));
  ASSERT_TRUE(config.has_value()) << config.error().message();
  EXPECT_EQ(Slurp(dest_ + "/a"), "new");
  EXPECT_EQ(Slurp(dest_ + "/b"), "old") << "the upper layer's file was written through a link";
  EXPECT_EQ(Slurp(dest_ + "/d"), "now a file");
  EXPECT_EQ(Slurp(dest_ + "/f"), "file again");
}

TEST_F(ImagesTest, LongAndNonAsciiNames) {
  const std::string long_dir = std::string(120, 'd') + "/" + std::string(120, 'e');
  OciBuilder oci;
  auto config = Unpack(oci.Image(
      {{File(long_dir + "/file", "deep"), File("caf\xc3\xa9/\xe6\x97\xa5\xe6\x9c\xac", "utf-8")},
       {File(long_dir + "/.wh.file", "")}}));
  ASSERT_TRUE(config.has_value()) << config.error().message();
  EXPECT_TRUE(Exists(dest_ + "/" + long_dir)) << "a name longer than ustar's 100 bytes was lost";
  EXPECT_FALSE(Exists(dest_ + "/" + long_dir + "/file"));
  EXPECT_EQ(Slurp(dest_ + "/caf\xc3\xa9/\xe6\x97\xa5\xe6\x9c\xac"), "utf-8");
}

// A zero-byte layer file is an empty layer: nothing in it, and its diff id is that of no bytes.
TEST_F(ImagesTest, EmptyLayerFile) {
  OciBuilder oci;
  json empty = oci.Blob("", kLayerTar);
  json layer = oci.Layer({File("a", "1")});
  json config = oci.Config();  // diff ids: layer's only; the empty one goes first
  json config_json = {
      {"config", json::object()},
      {"rootfs", {{"type", "layers"}, {"diff_ids", {"sha256:" + Sha256::Of(""), layer["digest"]}}}}};
  config = oci.Blob(config_json.dump(), kConfigType);
  auto result = Unpack(oci.Archive({oci.Manifest(config, {empty, layer})}));
  ASSERT_TRUE(result.has_value()) << result.error().message();
  EXPECT_EQ(Slurp(dest_ + "/a"), "1");
}

TEST_F(ImagesTest, IndexLeadsToTheLinuxAmd64Manifest) {
  OciBuilder oci;
  json arm = oci.Manifest(oci.Config(), {oci.Layer({File("arch", "arm64")})});
  json amd = [&] {
    OciBuilder other;  // its own diff ids
    json layer = other.Layer({File("arch", "amd64")});
    json config = other.Config();
    json manifest = other.Manifest(config, {layer});
    for (auto& [name, data] : other.members) oci.members[name] = data;
    return manifest;
  }();
  arm["platform"] = {{"os", "linux"}, {"architecture", "arm64"}};
  amd["platform"] = {{"os", "linux"}, {"architecture", "amd64"}};
  json index = oci.Blob(
      json{{"schemaVersion", 2}, {"mediaType", kIndexType}, {"manifests", {arm, amd}}}.dump(),
      kIndexType);
  auto config = Unpack(oci.Archive({index}));
  ASSERT_TRUE(config.has_value()) << config.error().message();
  EXPECT_EQ(Slurp(dest_ + "/arch"), "amd64");
  EXPECT_EQ(config->digest, amd["digest"].get<std::string>());
}

TEST_F(ImagesTest, DockerSaveLegacyLayout) {
  DockerSave save({{Dir("etc"), File("etc/os-release", "ID=test\n"), File("etc/gone", "x")},
                   {File("etc/.wh.gone", ""), File("hello", "world")}});
  auto config = Unpack(save.Archive());
  ASSERT_TRUE(config.has_value()) << config.error().message();
  EXPECT_EQ(Slurp(dest_ + "/etc/os-release"), "ID=test\n");
  EXPECT_EQ(Slurp(dest_ + "/hello"), "world");
  EXPECT_FALSE(Exists(dest_ + "/etc/gone"));
  EXPECT_EQ(config->env, (std::vector<std::string>{"HOME=/root"}));
  EXPECT_EQ(config->workdir, "/srv");
  EXPECT_EQ(config->user, "nobody");
  EXPECT_EQ(config->digest, "sha256:" + save.config_hex) << "the image id";
}

TEST_F(ImagesTest, DockerSaveLayerLinkedToAnotherMember) {
  // docker save writes a layer it has written already as a symlink to the first copy.
  const std::vector<Entry> same = {File("same", "1")};
  DockerSave save({same, {File("other", "2")}, same});
  save.members.erase(std::find_if(save.members.begin(), save.members.end(),
                                  [](const Entry& e) { return e.name == "layer2/layer.tar"; }));
  save.members.push_back(Symlink("layer2/layer.tar", "../layer0/layer.tar"));
  auto config = Unpack(save.Archive());
  ASSERT_TRUE(config.has_value()) << config.error().message();
  EXPECT_EQ(Slurp(dest_ + "/same"), "1");
  EXPECT_EQ(Slurp(dest_ + "/other"), "2");
}

// ---------------------------------------------------------------------------------------------
// Hostile layers

TEST_F(ImagesTest, RefusesDotDotEntry) {
  OciBuilder oci;
  ExpectRefused(Unpack(oci.Image({{File("ok", "1")}, {File("../escape", "x")}})),
                "layer 2 of 2 (sha256:");
  EXPECT_FALSE(Exists(top_ + "/escape"));
  ExpectRefused(Unpack(oci.Image({{File("a/../../escape", "x")}})),
                "entry 'a/../../escape': the name has a '..' component");
}

TEST_F(ImagesTest, RefusesAbsoluteEntry) {
  OciBuilder oci;
  ExpectRefused(Unpack(oci.Image({{File(top_ + "/abs", "x"), File("/tmp/x", "x")}})),
                "the name is absolute");
  EXPECT_FALSE(Exists(top_ + "/abs"));
}

TEST_F(ImagesTest, RefusesFileThroughSymlinkInTheSameLayer) {
  OciBuilder oci;
  ExpectRefused(Unpack(oci.Image({{Symlink("evil", outside_), File("evil/file", "x")}})),
                "entry 'evil/file': 'evil' is a symlink");
  ExpectRefused(Unpack(oci.Image({{Symlink("evil", "/"), File("evil/tmp/x", "x")}})),
                "'evil' is a symlink");
}

TEST_F(ImagesTest, RefusesFileThroughSymlinkFromALowerLayer) {
  OciBuilder oci;
  ExpectRefused(Unpack(oci.Image({{Dir("d"), Symlink("d/evil", "../../outside")},
                                  {File("d/evil/canary", "overwritten"), Dir("d/evil/new")}})),
                "'d/evil' is a symlink");
}

TEST_F(ImagesTest, RefusesDirectoryEntryThroughSymlink) {
  OciBuilder oci;
  ExpectRefused(Unpack(oci.Image({{Symlink("evil", outside_)}, {Dir("evil/made")}})),
                "'evil' is a symlink");
}

TEST_F(ImagesTest, RefusesHardLinkOutside) {
  OciBuilder oci;
  ExpectRefused(Unpack(oci.Image({{HardLink("pw", "/etc/passwd")}})),
                "its hard link target '/etc/passwd': the name is absolute");
  ExpectRefused(Unpack(oci.Image({{HardLink("c", "../canary")}})), "'..' component");
}

TEST_F(ImagesTest, RefusesHardLinkThroughSymlink) {
  OciBuilder oci;
  ExpectRefused(Unpack(oci.Image({{Symlink("evil", outside_)}, {HardLink("c", "evil/canary")}})),
                "hard link target 'evil/canary': 'evil' is a symlink");
}

TEST_F(ImagesTest, RefusesWhiteoutThroughSymlink) {
  OciBuilder oci;
  ExpectRefused(Unpack(oci.Image({{Symlink("evil", outside_)}, {File("evil/.wh.canary", "")}})),
                "whiteout 'evil/.wh.canary': 'evil' is a symlink");
  ExpectRefused(Unpack(oci.Image({{Symlink("evil", outside_)}, {File("evil/.wh..wh..opq", "")}})),
                "'evil' is a symlink");
}

// Links to outside are fine to have (they resolve inside the sandbox later); what replaces or
// removes them acts on the link, never on what it points to.
TEST_F(ImagesTest, ReplacingOrRemovingASymlinkActsOnTheLinkItself) {
  const struct stat outside_before = Lstat(outside_);
  Entry dir = Dir("dir-link", 0777);
  dir.uid = 4321;
  OciBuilder oci;
  auto config = Unpack(oci.Image({
      {Symlink("file-link", outside_ + "/canary"), Symlink("dir-link", outside_),
       Symlink("gone", outside_), Dir("o"), Symlink("o/link", outside_), File("o/file", "lower")},
      {File("file-link", "replaced"), dir, File(".wh.gone", ""), File("o/.wh..wh..opq", "")},
  }));
  ASSERT_TRUE(config.has_value()) << config.error().message();
  EXPECT_EQ(Slurp(dest_ + "/file-link"), "replaced");
  EXPECT_FALSE(S_ISLNK(Lstat(dest_ + "/file-link").st_mode));
  EXPECT_TRUE(S_ISDIR(Lstat(dest_ + "/dir-link").st_mode));
  EXPECT_EQ(Lstat(dest_ + "/dir-link").st_uid, 4321u);
  EXPECT_FALSE(Exists(dest_ + "/gone"));
  EXPECT_TRUE(List(dest_ + "/o").empty());
  ExpectNothingEscaped();
  const struct stat outside_after = Lstat(outside_);
  EXPECT_EQ(outside_after.st_mode, outside_before.st_mode) << "chmod went through a symlink";
  EXPECT_EQ(outside_after.st_uid, outside_before.st_uid) << "chown went through a symlink";
}

TEST_F(ImagesTest, RefusesWhiteoutOfDotDot) {
  OciBuilder oci;
  ExpectRefused(Unpack(oci.Image({{Dir("a")}, {File("a/.wh...", "")}})),
                "the whiteout names nothing to delete");
}

// ---------------------------------------------------------------------------------------------
// Hostile or broken archives

TEST_F(ImagesTest, RefusesArchiveMemberOutside) {
  OciBuilder oci;
  oci.extra.push_back(File("../escape", "x"));
  ExpectRefused(Unpack(oci.Image({{File("a", "1")}})), "member '../escape'");
  EXPECT_FALSE(Exists(top_ + "/escape"));
  OciBuilder abs;
  abs.extra.push_back(File("/tmp/x", "x"));
  ExpectRefused(Unpack(abs.Image({{File("a", "1")}})), "member '/tmp/x': the name is absolute");
}

TEST_F(ImagesTest, RefusesArchiveMemberThatIsADeviceOrEscapingLink) {
  OciBuilder oci;
  oci.extra.push_back(Entry{"dev", 'c'});
  ExpectRefused(Unpack(oci.Image({{File("a", "1")}})), "member 'dev': not a file");
  OciBuilder link;
  link.extra.push_back(Symlink("up", "../../outside/canary"));
  ExpectRefused(Unpack(link.Image({{File("a", "1")}})), "a symlink out of the archive");
}

TEST_F(ImagesTest, RefusesBlobDigestThatIsAPath) {
  OciBuilder oci;
  json layer = oci.Layer({File("a", "1")});
  layer["digest"] = "sha256:../../../outside/canary";
  ExpectRefused(Unpack(oci.Archive({oci.Manifest(oci.Config(), {layer})})),
                "is not sha256:<64 hex digits>");
}

TEST_F(ImagesTest, RefusesDockerLayerPathWithDotDot) {
  DockerSave save({{File("a", "1")}}, {"../outside/canary"});
  ExpectRefused(Unpack(save.Archive()), "layer 1 of 1 ('../outside/canary')");
  DockerSave abs({{File("a", "1")}}, {"/etc/passwd"});
  ExpectRefused(Unpack(abs.Archive()), "the name is absolute");
}

TEST_F(ImagesTest, RefusesBlobThatDoesNotMatchItsDigest) {
  OciBuilder oci;
  json layer = oci.Layer({File("a", "1")});
  json manifest = oci.Manifest(oci.Config(), {layer});
  // Same size, one bit changed, under the name the manifest gives.
  std::string& blob = oci.members["blobs/sha256/" + layer["digest"].get<std::string>().substr(7)];
  blob[blob.size() / 2] ^= 1;
  ExpectRefused(Unpack(oci.Archive({manifest})), "does not match its digest");
}

TEST_F(ImagesTest, RefusesBlobWhoseSizeIsNotItsDescriptors) {
  OciBuilder oci;
  json layer = oci.Layer({File("a", "1")});
  layer["size"] = layer["size"].get<uint64_t>() + 1;
  ExpectRefused(Unpack(oci.Archive({oci.Manifest(oci.Config(), {layer})})), "its descriptor says");
}

TEST_F(ImagesTest, RefusesMissingLayer) {
  OciBuilder oci;
  json first = oci.Layer({File("a", "1")});
  json second = oci.Layer({File("b", "2")});
  json manifest = oci.Manifest(oci.Config(), {first, second});
  oci.members.erase("blobs/sha256/" + second["digest"].get<std::string>().substr(7));
  ExpectRefused(Unpack(oci.Archive({manifest})), "layer 2 of 2");
  DockerSave save({{File("a", "1")}, {File("b", "2")}});
  std::erase_if(save.members, [](const Entry& e) { return e.name == "layer1/layer.tar"; });
  ExpectRefused(Unpack(save.Archive()), "'layer1/layer.tar' is not in the image archive");
}

TEST_F(ImagesTest, RefusesLayerThatIsNotWhatTheConfigSays) {
  DockerSave save({{File("a", "1")}});
  for (Entry& e : save.members) {
    if (e.name == "layer0/layer.tar") e.data = Tar({File("a", "tampered")});
  }
  ExpectRefused(Unpack(save.Archive()), "the config says sha256:");
}

TEST_F(ImagesTest, RefusesMalformedJsonAndUnknownLayouts) {
  OciBuilder oci;
  oci.Image({{File("a", "1")}});
  std::string archive = oci.Archive({oci.manifest});
  oci.members["index.json"] = "{not json";
  std::vector<Entry> entries;
  for (const auto& [name, data] : oci.members) entries.push_back(File(name, data));
  ExpectRefused(Unpack(Tar(entries)), "index.json is not valid JSON");
  ExpectRefused(Unpack(Tar({File("hello", "world")})), "neither an OCI image layout");
  ExpectRefused(Unpack("this is not a tar file at all, just some bytes"), "image archive");
}

TEST_F(ImagesTest, MissingArchiveIsNotFound) {
  auto result = UnpackImage(top_ + "/nope.tar", dest_);
  ASSERT_FALSE(result.has_value());
  EXPECT_EQ(result.error().code(), ErrorCode::kNotFound);
}

TEST_F(ImagesTest, DestinationMustBeEmpty) {
  std::ofstream(dest_ + "/already") << "here";
  OciBuilder oci;
  auto result = Unpack(oci.Image({{File("a", "1")}}));
  ASSERT_FALSE(result.has_value());
  EXPECT_EQ(result.error().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(Slurp(dest_ + "/already"), "here") << "a failed call emptied a dest it refused";
}

// ---------------------------------------------------------------------------------------------
// Limits

TEST_F(ImagesTest, ByteLimit) {
  OciBuilder oci;
  // Compressed, so that the archive itself stays well below the limit.
  const std::string archive =
      oci.Image({{File("a", std::string(3000, 'a'))}, {File("b", std::string(3000, 'b'))}},
                Compression::kGzip);
  auto result = Unpack(archive, UnpackLimits{.max_bytes = 5000, .max_entries = 1000});
  ASSERT_FALSE(result.has_value());
  EXPECT_EQ(result.error().code(), ErrorCode::kTooLarge) << result.error().message();
  EXPECT_NE(result.error().message().find("layer 2 of 2"), std::string::npos)
      << result.error().message();
  EXPECT_TRUE(List(dest_).empty());
  // The same image within a larger limit unpacks.
  ASSERT_TRUE(Unpack(archive, UnpackLimits{.max_bytes = 7000}).has_value());
}

TEST_F(ImagesTest, EntryLimit) {
  std::vector<Entry> many;
  for (int i = 0; i < 50; ++i) many.push_back(File("f" + std::to_string(i), ""));
  OciBuilder oci;
  auto result = Unpack(oci.Image({many}), UnpackLimits{.max_entries = 40});
  ASSERT_FALSE(result.has_value());
  EXPECT_EQ(result.error().code(), ErrorCode::kTooLarge) << result.error().message();
  EXPECT_TRUE(List(dest_).empty());
}

}  // namespace
}  // namespace airlock::images
