package kernel

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Version
		wantErr bool
	}{
		{in: "6.1.0-56-cloud-amd64", want: Version{6, 1, 0, "6.1.0-56-cloud-amd64"}},
		{in: "3.10.0-957.1.3.el7.x86_64", want: Version{3, 10, 0, "3.10.0-957.1.3.el7.x86_64"}},
		{in: "6.18.44-fc-v669\n", want: Version{6, 18, 44, "6.18.44-fc-v669"}},
		{in: "  5.15.0-1034-azure \n", want: Version{5, 15, 0, "5.15.0-1034-azure"}},
		{in: "4.19", want: Version{4, 19, 0, "4.19"}},
		{in: "4.19.", want: Version{4, 19, 0, "4.19."}},
		{in: "4.19.x", want: Version{4, 19, 0, "4.19.x"}},
		{in: "5.4.0+", want: Version{5, 4, 0, "5.4.0+"}},
		{in: "2.6.32.71-1.el6", want: Version{2, 6, 32, "2.6.32.71-1.el6"}},
		{in: "6.8-rc1", want: Version{6, 8, 0, "6.8-rc1"}},
		{in: "", wantErr: true},
		{in: "6", wantErr: true},
		{in: "6.", wantErr: true},
		{in: "6-rc1", wantErr: true},
		{in: "v6.1.0", wantErr: true},
		{in: "Linux", wantErr: true},
		{in: "99999999999999999999.1", wantErr: true},
	} {
		got, err := ParseVersion(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("ParseVersion(%q) error = %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("ParseVersion(%q) (-want +got):\n%s", tc.in, diff)
		}
	}
}

func TestVersionCompare(t *testing.T) {
	v := func(s string) Version {
		t.Helper()
		v, err := ParseVersion(s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"4.18.20", "4.19", -1},
		{"4.19.0-1-amd64", "4.19", 0},
		{"4.19.1", "4.19.0", 1},
		{"5.0.0", "4.20.17", 1},
		{"3.10.0-957.1.3.el7.x86_64", "4.19", -1},
	} {
		if got := v(tc.a).Compare(v(tc.b)); got != tc.want {
			t.Errorf("%s.Compare(%s) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := v(tc.b).Compare(v(tc.a)); got != -tc.want {
			t.Errorf("%s.Compare(%s) = %d, want %d", tc.b, tc.a, got, -tc.want)
		}
	}
	if got := (Version{Major: 5, Minor: 4}).String(); got != "5.4.0" {
		t.Errorf("String of a hand-made Version = %q, want 5.4.0", got)
	}
}

func TestVersionAtLeast(t *testing.T) {
	for _, tc := range []struct {
		v, o string
		want bool
	}{
		{"4.19.0", "4.19", true},
		{"4.19.0-56-cloud-amd64", "4.19.0", true},
		{"4.18.99", "4.19", false},
		{"5.9.0", "5.9.1", false},
		{"6.1.0", "5.9", true},
		{"3.10.0-957.1.3.el7.x86_64", "4.1", false},
	} {
		v, err := ParseVersion(tc.v)
		if err != nil {
			t.Fatal(err)
		}
		o, err := ParseVersion(tc.o)
		if err != nil {
			t.Fatal(err)
		}
		if got := v.AtLeast(o); got != tc.want {
			t.Errorf("%s.AtLeast(%s) = %v, want %v", tc.v, tc.o, got, tc.want)
		}
	}
}

func TestKernelVersion(t *testing.T) {
	for _, tc := range []struct {
		name    string
		files   map[string]string
		want    Version
		wantErr bool
	}{
		{name: "this machine", files: layoutThisMachine(t), want: Version{6, 18, 44, "6.18.44-fc-v669"}},
		{name: "centos 7", files: layoutCentOS7(t), want: Version{3, 10, 0, "3.10.0-957.1.3.el7.x86_64"}},
		{name: "no osrelease", files: map[string]string{}, wantErr: true},
		{name: "garbage", files: map[string]string{osreleasePath: "unknown\n"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := &Kernel{Root: writeTree(t, tc.files)}
			got, err := k.Version()
			if (err != nil) != tc.wantErr {
				t.Fatalf("Version() error = %v, want error %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Version() (-want +got):\n%s", diff)
			}
		})
	}
}
