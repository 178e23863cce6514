/* Stands in for libnvshare.so in the nvshare-run tests: a valid shared object that does nothing, so
 * the dynamic loader preloads it without complaint. C, so that a sanitizer build (which instruments
 * C++) still produces an object any program can preload. */
__attribute__((visibility("default"))) int nvshare_run_test_preload_stub(void) { return 0; }
