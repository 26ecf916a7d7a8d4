package nodepaths

import "testing"

// TestStateDir: the flag wins, then Dowse's variable, then Akri's, then
// the default.
func TestStateDir(t *testing.T) {
	for name, tc := range map[string]struct{ flag, env, akri, want string }{
		"default":         {want: DefaultStateDir},
		"akri":            {akri: "/akri", want: "/akri"},
		"env before akri": {env: "/env", akri: "/akri", want: "/env"},
		"flag first":      {flag: "/flag", env: "/env", akri: "/akri", want: "/flag"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(StateDirEnv, tc.env)
			t.Setenv(AkriStateDirEnv, tc.akri)
			if got := StateDir(tc.flag); got != tc.want {
				t.Errorf("StateDir(%q) = %q, want %q", tc.flag, got, tc.want)
			}
		})
	}
}
