package kernel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"k8s.io/klog/v2"
)

// procModules lists the loaded modules; it exists only on kernels built with
// loadable-module support (CONFIG_MODULES).
const procModules = "/proc/modules"

// Modules is what the kernel has to offer in modules: the ones loaded now,
// the ones built into the image, and the build config when one was found.
// Make one with [Kernel.Modules]; a hand-made Modules is fine in tests.
type Modules struct {
	// Version is the running kernel's release.
	Version Version
	// Loadable is true when the kernel supports loadable modules, which
	// Linux shows by having /proc/modules. Only then can modprobe help.
	Loadable bool
	// Loaded holds the modules in /proc/modules, names normalized (see
	// [ParseModules]).
	Loaded map[string]bool
	// BuiltIn holds the modules listed in
	// /lib/modules/<release>/modules.builtin.
	BuiltIn map[string]bool
	// Config is the kernel's build config, or nil if none was found.
	Config Config
	// ConfigPath is where Config was read from, or "".
	ConfigPath string
}

// Has reports whether module is available without loading anything: loaded,
// listed in modules.builtin, or =y in the kernel config. Module names are
// compared as modprobe does, with '-' and '_' the same.
func (m *Modules) Has(module string) bool {
	name := normalizeModule(module)
	return m.Loaded[name] || m.BuiltIn[name] || m.Config.BuiltIn(name)
}

// normalizeModule returns module as the kernel names it in /proc/modules:
// dashes become underscores, as modprobe treats them the same.
func normalizeModule(module string) string {
	return strings.ReplaceAll(module, "-", "_")
}

// ParseModules returns the module names in the text of /proc/modules (the
// first field of each line), normalized with '-' as '_', in file order.
// Lines that are blank are skipped. It never fails.
func ParseModules(data []byte) []string {
	var mods []string
	for _, line := range bytes.Split(data, []byte{'\n'}) {
		fields := strings.Fields(string(line))
		if len(fields) > 0 {
			mods = append(mods, normalizeModule(fields[0]))
		}
	}
	return mods
}

// ParseBuiltinModules returns the module names in the text of
// modules.builtin, whose lines are paths such as
// "kernel/net/netfilter/nf_conntrack.ko": the file name without ".ko" (or a
// compressed ".ko.xz", ".ko.zst", ".ko.gz"), normalized with '-' as '_'.
// Lines that do not name a .ko file are skipped. It never fails.
func ParseBuiltinModules(data []byte) []string {
	var mods []string
	for _, line := range bytes.Split(data, []byte{'\n'}) {
		base := path.Base(strings.TrimSpace(string(line)))
		for _, ext := range []string{".ko", ".ko.xz", ".ko.zst", ".ko.gz"} {
			if name, ok := strings.CutSuffix(base, ext); ok && name != "" {
				mods = append(mods, normalizeModule(name))
				break
			}
		}
	}
	return mods
}

// Modules reads which modules the running kernel has: /proc/modules for the
// loaded ones, modules.builtin under /lib/modules/<release> (or
// /usr/lib/modules/<release>) and the kernel config (/boot/config-<release>
// or /proc/config.gz) for the built-in ones. Missing files are not errors,
// except that a kernel without loadable modules (no /proc/modules) must
// offer modules.builtin or a config, since nothing else says what it has.
func (k *Kernel) Modules(ctx context.Context) (*Modules, error) {
	logger := klog.FromContext(ctx)
	v, err := k.Version()
	if err != nil {
		return nil, err
	}
	m := &Modules{Version: v, Loaded: map[string]bool{}, BuiltIn: map[string]bool{}}

	data, err := k.readFile(procModules)
	switch {
	case err == nil:
		m.Loadable = true
		for _, name := range ParseModules(data) {
			m.Loaded[name] = true
		}
	case errors.Is(err, fs.ErrNotExist):
		logger.V(2).Info("No /proc/modules: kernel without loadable modules, looking for built-in ones only", "kernel", v)
	default:
		return nil, err
	}

	builtinErr := k.readBuiltin(m)
	if builtinErr != nil && !errors.Is(builtinErr, fs.ErrNotExist) {
		return nil, builtinErr
	}
	config, configPath, configErr := k.Config(v)
	if configErr != nil && !errors.Is(configErr, fs.ErrNotExist) {
		return nil, configErr
	}
	m.Config, m.ConfigPath = config, configPath
	if !m.Loadable && builtinErr != nil && configErr != nil {
		return nil, fmt.Errorf("kernel %s has no loadable modules and nothing says which are built in: %w", v, errors.Join(builtinErr, configErr))
	}
	logger.V(4).Info("Kernel modules", "kernel", v, "loadable", m.Loadable, "loaded", len(m.Loaded), "builtIn", len(m.BuiltIn), "config", configPath)
	return m, nil
}

// readBuiltin fills m.BuiltIn from the first modules.builtin found.
func (k *Kernel) readBuiltin(m *Modules) error {
	rel := m.Version.Release
	if rel == "" || strings.Contains(rel, "/") {
		return fmt.Errorf("modules.builtin: kernel release %q: %w", rel, fs.ErrNotExist)
	}
	var errs []error
	for _, dir := range []string{"/lib/modules/", "/usr/lib/modules/"} {
		data, err := k.readFile(dir + rel + "/modules.builtin")
		if err != nil {
			errs = append(errs, err)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return err
		}
		for _, name := range ParseBuiltinModules(data) {
			m.BuiltIn[name] = true
		}
		return nil
	}
	return errors.Join(errs...)
}

// modprobe runs `modprobe -- name` through k.Exec within k's timeout and
// returns its output. A modprobe killed by the timeout is an error that
// says so.
func (k *Kernel) modprobe(ctx context.Context, name string) ([]byte, error) {
	timeout := k.ModprobeTimeout
	if timeout == 0 {
		timeout = DefaultModprobeTimeout
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, timeout, errModprobeTimeout)
		defer cancel()
	}
	out, err := k.Exec.CommandContext(ctx, "modprobe", "--", name).CombinedOutput()
	if err != nil && errors.Is(context.Cause(ctx), errModprobeTimeout) {
		return out, fmt.Errorf("modprobe %s: killed: timed out after %v: %w", name, timeout, err)
	}
	return out, err
}

// errModprobeTimeout is the cause of a modprobe's context ending at its
// timeout.
var errModprobeTimeout = errors.New("modprobe timed out")

// MissingModulesError is returned by [Kernel.EnsureModules] when some
// modules are neither present nor loadable.
type MissingModulesError struct {
	// Kernel is the running kernel's release.
	Kernel Version
	// Modules are the missing modules, in the order they were asked for.
	Modules []string
}

// Error names the kernel and every missing module.
func (e *MissingModulesError) Error() string {
	return fmt.Sprintf("kernel %s: missing modules %s", e.Kernel, strings.Join(e.Modules, ", "))
}

// EnsureModules makes sure that each of modules is available: it returns at
// once for those that are loaded or built in and, where the kernel supports
// loadable modules and k.Exec is set, runs `modprobe -- NAME` for each of
// the others. It returns the modules that modprobe loaded, and a
// *MissingModulesError listing the ones still missing (nil if none are).
// Any other error (an unreadable /proc/modules, say) comes back as is.
func (k *Kernel) EnsureModules(ctx context.Context, modules ...string) (loaded []string, err error) {
	m, err := k.Modules(ctx)
	if err != nil {
		return nil, err
	}
	loaded, missing := k.ensure(ctx, m, modules)
	if len(missing) > 0 {
		return loaded, &MissingModulesError{Kernel: m.Version, Modules: missing}
	}
	return loaded, nil
}

// ensure runs modprobe for the modules that m lacks, records those that
// loaded in m.Loaded, and returns the ones loaded and the ones still
// missing, each in the order asked for and without duplicates.
func (k *Kernel) ensure(ctx context.Context, m *Modules, modules []string) (loaded, missing []string) {
	logger := klog.FromContext(ctx)
	for _, module := range modules {
		name := normalizeModule(module)
		if m.Has(name) || slices.Contains(missing, name) {
			continue
		}
		if !m.Loadable || k.Exec == nil {
			missing = append(missing, name)
			continue
		}
		out, err := k.modprobe(ctx, name)
		if err != nil {
			logger.V(2).Info("modprobe failed", "module", name, "err", err, "output", strings.TrimSpace(string(out)))
			missing = append(missing, name)
			continue
		}
		logger.Info("Loaded kernel module", "module", name)
		m.Loaded[name] = true
		loaded = append(loaded, name)
	}
	return loaded, missing
}
