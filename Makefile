# ferroccl: build and install.
#
#   make                               cargo build --release (libferroccl and its NCCL library)
#   make install PREFIX=/opt/ferroccl  libraries, headers, launcher, CMake package, pkg-config;
#                                      libferroccl.so.<version> with the links .so.<major>
#                                      (its SONAME) and .so; NCCL's ABI as
#                                      <LIBDIR>/ferroccl/libnccl.so.2 (+ libnccl.so) with
#                                      <INCLUDEDIR>/ferroccl/nccl.h (docs/nccl.md)
#   make uninstall PREFIX=...          removes what install put there
#   make clean                         cargo clean, generated API docs
#   make doc                           API reference into docs/api/ (needs doxygen)
#   make test-install test-symbols     tests/install/run.sh, tests/symbols.sh
#
# Variables: PREFIX (/usr/local), DESTDIR (staging root, prepended to every path),
# LIBDIR, INCLUDEDIR, BINDIR, CARGO (cargo), CARGO_TARGET_DIR (target), OBJCOPY (objcopy),
# SPLIT_DEBUG (1; 0 installs the shared libraries and the launcher as built).
#
# Debug information: the installed shared libraries and launcher are stripped, and their
# debug information goes to a file of the same name plus .debug in a .debug directory
# beside them (objcopy --only-keep-debug, then --strip-unneeded --add-gnu-debuglink), as
# distributions ship it: gdb and perf find it through the debug link, addr2line reads it
# directly (addr2line -e <LIBDIR>/.debug/libferroccl.so.<version>.debug ADDR). The static
# library keeps its debug information: a static link's own strip policy decides.
#
# The version is not written here: it is read from include/ferroccl.h (FCCL_MAJOR,
# FCCL_MINOR, FCCL_PATCH, which cbindgen takes from src/ffi/mod.rs) and substituted into
# the CMake and pkg-config files at install time.

PREFIX     ?= /usr/local
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
BINDIR     ?= $(PREFIX)/bin
CMAKEDIR   ?= $(LIBDIR)/cmake/ferroccl
PCDIR      ?= $(LIBDIR)/pkgconfig
DESTDIR    ?=

CARGO      ?= cargo
INSTALL    ?= install
OBJCOPY    ?= objcopy
SPLIT_DEBUG ?= 1
# Paths are relative to this Makefile, so `make -C DIR` and `make -f DIR/Makefile` work.
ROOT       := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(ROOT)/target)
OUT        := $(TARGET_DIR)/release

HEADER     := $(ROOT)/include/ferroccl.h
NCCL_HDR   := $(ROOT)/include/ferroccl/nccl.h
LIBS       := $(OUT)/libferroccl.so $(OUT)/libferroccl.a
NCCL_LIB   := $(OUT)/libferroccl_nccl.so
NCCLDIR    := $(LIBDIR)/ferroccl
LAUNCHER   := $(OUT)/ferroccl-run
BENCH      := $(OUT)/ferroccl-bench

HASH := \#
VERSION := $(shell awk '$$1 == "$(HASH)define" && $$2 ~ /^FCCL_(MAJOR|MINOR|PATCH)$$/ { v[$$2] = $$3 } \
  END { if (length(v) == 3) print v["FCCL_MAJOR"] "." v["FCCL_MINOR"] "." v["FCCL_PATCH"] }' $(HEADER))

# libferroccl.so's SONAME is libferroccl.so.$(MAJOR) (build.rs).
MAJOR := $(firstword $(subst ., ,$(VERSION)))
SOFILE := libferroccl.so.$(VERSION)

# System libraries that Rust's std needs when libferroccl.a is linked into a C program
# (`rustc --print native-static-libs` on *-unknown-linux-gnu: -lgcc_s -lutil -lrt
# -lpthread -lm -ldl -lc).
STATIC_DEPS ?= gcc_s util rt pthread m dl

# Absolute paths: they are written into the pkg-config files.
override PREFIX     := $(abspath $(PREFIX))
override LIBDIR     := $(abspath $(LIBDIR))
override INCLUDEDIR := $(abspath $(INCLUDEDIR))
override BINDIR     := $(abspath $(BINDIR))
override CMAKEDIR   := $(abspath $(CMAKEDIR))
override PCDIR      := $(abspath $(PCDIR))
override DEBUGDIR   := $(LIBDIR)/.debug
override NCCLDEBUGDIR := $(LIBDIR)/ferroccl/.debug
override BINDEBUGDIR := $(BINDIR)/.debug

# Paths of the installed tree relative to the CMake package directory, so that the
# package still works after the whole prefix is moved.
relpath = $(shell realpath -m --relative-to='$(2)' '$(1)')

# install_elf SRC DEST DEBUGDIR: SRC to DEST, stripped, its debug information in
# DEBUGDIR/<name of DEST>.debug (with SPLIT_DEBUG=0, a plain copy).
define install_elf
	$(if $(filter 1,$(SPLIT_DEBUG)),\
	  $(INSTALL) -d '$(DESTDIR)$(3)' && \
	  $(OBJCOPY) --only-keep-debug '$(1)' '$(DESTDIR)$(3)/$(notdir $(2)).debug' && \
	  chmod 644 '$(DESTDIR)$(3)/$(notdir $(2)).debug' && \
	  $(OBJCOPY) --strip-unneeded --add-gnu-debuglink='$(DESTDIR)$(3)/$(notdir $(2)).debug' '$(1)' '$(DESTDIR)$(2).tmp' && \
	  chmod 755 '$(DESTDIR)$(2).tmp' && mv -f '$(DESTDIR)$(2).tmp' '$(DESTDIR)$(2)',\
	  $(INSTALL) -m 755 '$(1)' '$(DESTDIR)$(2)')
endef

.PHONY: all build install uninstall clean doc test-install test-symbols version

all: build

build:
	$(CARGO) build --release --manifest-path '$(ROOT)/Cargo.toml'

version:
	@echo $(VERSION)

# Builds first when cargo is at hand (a no-op when up to date); without cargo (e.g.
# `sudo make install` with cargo only in the user's PATH) installs what is built.
BUILD_FIRST := $(if $(shell command -v $(CARGO) 2>/dev/null),build,)

install: $(BUILD_FIRST)
	@test -n "$(VERSION)" || { echo "install: no FCCL_MAJOR/MINOR/PATCH in $(HEADER)" >&2; exit 1; }
	@for f in $(LIBS) $(NCCL_LIB) $(LAUNCHER) $(BENCH); do test -f "$$f" || { echo "install: $$f missing; run make first" >&2; exit 1; }; done
	$(INSTALL) -d '$(DESTDIR)$(LIBDIR)' '$(DESTDIR)$(INCLUDEDIR)/ferroccl' '$(DESTDIR)$(BINDIR)' \
	  '$(DESTDIR)$(CMAKEDIR)' '$(DESTDIR)$(PCDIR)' '$(DESTDIR)$(NCCLDIR)'
	@if [ "$(SPLIT_DEBUG)" = 1 ] && ! command -v $(OBJCOPY) >/dev/null; then \
	  echo "install: $(OBJCOPY) (binutils) splits the debug information; install it, or make install SPLIT_DEBUG=0" >&2; exit 1; fi
	$(call install_elf,$(OUT)/libferroccl.so,$(LIBDIR)/$(SOFILE),$(DEBUGDIR))
	ln -sfn $(SOFILE) '$(DESTDIR)$(LIBDIR)/libferroccl.so.$(MAJOR)'
	ln -sfn libferroccl.so.$(MAJOR) '$(DESTDIR)$(LIBDIR)/libferroccl.so'
	$(INSTALL) -m 644 $(OUT)/libferroccl.a '$(DESTDIR)$(LIBDIR)/libferroccl.a'
	$(call install_elf,$(NCCL_LIB),$(NCCLDIR)/libnccl.so.2,$(NCCLDEBUGDIR))
	ln -sfn libnccl.so.2 '$(DESTDIR)$(NCCLDIR)/libnccl.so'
	$(INSTALL) -m 644 $(HEADER) '$(DESTDIR)$(INCLUDEDIR)/ferroccl.h'
	$(INSTALL) -m 644 $(NCCL_HDR) '$(DESTDIR)$(INCLUDEDIR)/ferroccl/nccl.h'
	$(call install_elf,$(LAUNCHER),$(BINDIR)/ferroccl-run,$(BINDEBUGDIR))
	$(call install_elf,$(BENCH),$(BINDIR)/ferroccl-bench,$(BINDEBUGDIR))
	sed -e 's|@FERROCCL_PREFIX_REL@|$(call relpath,$(PREFIX),$(CMAKEDIR))|g' \
	    -e 's|@FERROCCL_LIBDIR_REL@|$(call relpath,$(LIBDIR),$(PREFIX))|g' \
	    -e 's|@FERROCCL_INCLUDEDIR_REL@|$(call relpath,$(INCLUDEDIR),$(PREFIX))|g' \
	    -e 's|@FERROCCL_BINDIR_REL@|$(call relpath,$(BINDIR),$(PREFIX))|g' \
	    -e 's|@FERROCCL_NCCLDIR_REL@|$(call relpath,$(NCCLDIR),$(PREFIX))|g' \
	    -e 's|@FERROCCL_STATIC_DEPS@|$(STATIC_DEPS)|g' \
	    -e 's|@FERROCCL_SONAME@|libferroccl.so.$(MAJOR)|g' -e 's|@FERROCCL_LIBFILE@|libferroccl.so|g' \
	    '$(ROOT)/cmake/ferrocclConfig.cmake.in' > '$(DESTDIR)$(CMAKEDIR)/ferrocclConfig.cmake'
	sed -e 's|@FERROCCL_VERSION@|$(VERSION)|g' \
	    '$(ROOT)/cmake/ferrocclConfigVersion.cmake.in' > '$(DESTDIR)$(CMAKEDIR)/ferrocclConfigVersion.cmake'
	for pc in ferroccl ferroccl-nccl; do \
	  sed -e 's|@FERROCCL_VERSION@|$(VERSION)|g' -e 's|@PREFIX@|$(PREFIX)|g' \
	      -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' -e 's|@BINDIR@|$(BINDIR)|g' \
	      -e 's|@NCCLDIR@|$(NCCLDIR)|g' -e 's|@FERROCCL_LINK@|-L$${libdir} -lferroccl|g' \
	      -e 's|@FERROCCL_NCCL_LINK@|-L$${nccllibdir} -lnccl|g' \
	      -e 's|@FERROCCL_STATIC_LIBS@|$(addprefix -l,$(STATIC_DEPS))|g' \
	      '$(ROOT)/cmake/'$$pc.pc.in > '$(DESTDIR)$(PCDIR)/'$$pc.pc || exit 1; \
	done
	@echo "installed ferroccl $(VERSION) into $(DESTDIR)$(PREFIX)"

uninstall:
	rm -f '$(DESTDIR)$(LIBDIR)/libferroccl.so' '$(DESTDIR)$(LIBDIR)/libferroccl.so.$(MAJOR)' \
	  '$(DESTDIR)$(LIBDIR)/$(SOFILE)' '$(DESTDIR)$(DEBUGDIR)/$(SOFILE).debug' '$(DESTDIR)$(LIBDIR)/libferroccl.a' \
	  '$(DESTDIR)$(NCCLDIR)/libnccl.so.2' '$(DESTDIR)$(NCCLDIR)/libnccl.so' '$(DESTDIR)$(NCCLDEBUGDIR)/libnccl.so.2.debug' \
	  '$(DESTDIR)$(BINDEBUGDIR)/ferroccl-run.debug' '$(DESTDIR)$(BINDEBUGDIR)/ferroccl-bench.debug' \
	  '$(DESTDIR)$(INCLUDEDIR)/ferroccl.h' '$(DESTDIR)$(INCLUDEDIR)/ferroccl/nccl.h' \
	  '$(DESTDIR)$(BINDIR)/ferroccl-run' '$(DESTDIR)$(BINDIR)/ferroccl-bench' \
	  '$(DESTDIR)$(CMAKEDIR)/ferrocclConfig.cmake' '$(DESTDIR)$(CMAKEDIR)/ferrocclConfigVersion.cmake' \
	  '$(DESTDIR)$(PCDIR)/ferroccl.pc' '$(DESTDIR)$(PCDIR)/ferroccl-nccl.pc'
	-rmdir '$(DESTDIR)$(INCLUDEDIR)/ferroccl' '$(DESTDIR)$(CMAKEDIR)' '$(DESTDIR)$(NCCLDEBUGDIR)' '$(DESTDIR)$(NCCLDIR)' \
	  '$(DESTDIR)$(DEBUGDIR)' '$(DESTDIR)$(BINDEBUGDIR)' 2>/dev/null

clean:
	$(CARGO) clean --manifest-path '$(ROOT)/Cargo.toml'
	rm -rf '$(ROOT)/docs/api'

doc:
	cd '$(ROOT)' && FERROCCL_VERSION=$(VERSION) doxygen docs/Doxyfile

test-install:
	bash '$(ROOT)/tests/install/run.sh'

test-symbols:
	bash '$(ROOT)/tests/symbols.sh'
