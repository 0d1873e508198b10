package io.twopc.flink;

import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;
import static org.assertj.core.api.Assertions.catchThrowable;

import java.time.Duration;
import java.util.List;

import org.apache.flink.api.common.serialization.SimpleStringSchema;
import org.apache.flink.util.InstantiationUtil;
import org.junit.Test;

/** {@link PostgresDestination}: what it refuses, and that no password ever shows. */
public class PostgresDestinationTest {
    private static PostgresDestination orders() {
        return PostgresDestination.url("postgres://app@db.example:5432/shop")
                .table("public.orders")
                .columns("id", "customer");
    }

    @Test
    public void workingSettingsHaveNoProblemsAndSettersReturnCopies() throws Exception {
        PostgresDestination base = orders();
        assertThat(base.problems()).isEmpty();
        PostgresDestination idempotent = base.idempotent("id");
        assertThat(idempotent.problems()).isEmpty();
        assertThat(base.mode()).as("the original is unchanged").isEqualTo(PostgresMode.TRANSACTIONAL);
        assertThat(idempotent.mode()).isEqualTo(PostgresMode.IDEMPOTENT);
        assertThat(PostgresDestination.host("db", 5432, "shop", "app").table("t").columns("a").problems()).isEmpty();
        // Shipped with the job graph.
        assertThat(InstantiationUtil.clone(idempotent).toString()).isEqualTo(idempotent.toString());
    }

    @Test
    public void everyMistakeIsNamedWithWhatToChange() {
        assertProblem(PostgresDestination.url(null).table("t").columns("a"), "neither a URL nor a host");
        assertProblem(PostgresDestination.host("db", 0, "shop", "app").table("t").columns("a"), "not a TCP port");
        assertProblem(PostgresDestination.host("db", 5432, null, "app").table("t").columns("a"), "database is not set");
        assertProblem(PostgresDestination.url("db.example").table("t").columns("a"), "is neither");
        assertProblem(orders().table(null), "table is not set");
        assertProblem(orders().table("a.b.c"), "more than one '.'");
        assertProblem(orders().columns(), "columns are not set");
        assertProblem(orders().columns("id", "id"), "listed twice");
        assertProblem(orders().columns("id", " customer"), "white space");
        assertProblem(orders().columns("id", new String(new char[64]).replace('\0', 'x')), "longer than 63 bytes");
        assertProblem(orders().idempotent(), "idempotent mode needs key columns");
        assertProblem(orders().idempotent("sku"), "key column \"sku\" is not in columns");
        assertProblem(orders().idempotent("id").transactionIdColumn("txn"), "transactional mode only");
        assertProblem(orders().transactionIdColumn("customer"), "is also in columns");
        assertProblem(orders().copyFormat(null), "COPY format is null");
        assertProblem(orders().controlSchema(""), "control schema is empty");
        assertProblem(orders().connectTimeout(Duration.ZERO), "must be at least 1 ms");
        assertProblem(orders().passwordFromEnvironment(" "), "password environment variable name is empty");
    }

    /**
     * Connection strings: {form, the password text it carries ("" for none), accepted?}. The same
     * forms as the native side's test (twopc-pg conninfo.rs), which refuses and accepts alike.
     */
    private static final Object[][] FORMS = {
        {"postgres://app@db.example:5432/shop", "", true},
        {"postgresql://app@db.example/shop", "", true},
        {"postgres://db.example:5432/shop", "", true},
        {"postgres://app@[::1]:5432/shop", "", true},
        {"postgres://app@[2001:db8::7]/shop?application_name=x", "", true},
        {"postgres://app%40corp@db/shop", "", true},
        {"postgres://app@%2Fvar%2Frun%2Fpostgresql/shop", "", true},
        {"postgres://app:s3cret-Pw@db:5432/shop", "s3cret-Pw", false},
        {"postgresql://app:s3cret-Pw@db/shop", "s3cret-Pw", false},
        {"postgres://app:pw/x-Tail9@db/shop", "pw/x-Tail9", false},
        {"postgres://app:pw?x-Tail9@db/shop", "pw?x-Tail9", false},
        {"postgres://app:pw#x-Tail9@db/shop", "pw#x-Tail9", false},
        {"postgres://app:p@ss-Tail9@db/shop", "ss-Tail9", false},
        {"postgres://app:p%40ss-Tail9@db/shop", "p%40ss-Tail9", false},
        {"postgres://app:s3cret-Pw@[::1]:5432/shop", "s3cret-Pw", false},
        {"postgres://app:@db/shop", "", false},
        {"postgres://app@db/shop?password=s3cret-Pw", "s3cret-Pw", false},
        {"postgres://app@db/shop?sslmode=disable&PassWord=s3cret-Pw", "s3cret-Pw", false},
        {"postgres://db/shop?options=x:s3cret-Pw@evil", "s3cret-Pw", false},
        {"postgres://app@db/shop#s3cret-Pw", "s3cret-Pw", false},
        {"POSTGRES://app:s3cret-Pw@db/shop", "s3cret-Pw", false},
        {"mysql://app:s3cret-Pw@db/shop", "s3cret-Pw", false},
        {"host=db port=5432 dbname=shop user=app", "", true},
        {"host=db user=app password=s3cret-Pw dbname=shop", "s3cret-Pw", false},
        {"host=db user=app password = s3cret-Pw dbname=shop", "s3cret-Pw", false},
        {"host=db user=app password='s3cret Pw' dbname=shop", "s3cret Pw", false},
        {"host=db user=app password='it\\'s-s3cret' dbname=shop", "s3cret", false},
        {"host=db user=app password='s3cret-Pw", "s3cret-Pw", false},
        {"host=db user=app sslpassword=s3cret-Pw", "s3cret-Pw", false},
        // A setting given twice: the client would silently take one of them.
        {"host=db user=app dbname=shop user=other", "", false},
        {"host=a host=b user=app", "", false},
        {"host=a,b user=app dbname=shop", "", true},
        {"postgres://app@db/shop?user=other", "", false},
        {"postgres://app@%2Fvar%2Frun/shop?user=x", "", false},
        {"postgres://db/shop?a=1&&b=2&&c=3", "", true},
        {"postgres://db/shop?port=1&port=2", "", false},
        {"postgres://db/shop?user=app", "", true},
        {"postgres://app@db/shop?dbname=other", "", false},
        {"postgres://app@db?dbname=shop", "", true},
        {"postgres://app@db/shop?application_name=a&application_name=b", "", false},
    };

    @Test
    public void aPasswordInTheConnectionStringIsRefusedInEveryFormAndNeverPrinted() throws Exception {
        for (Object[] form : FORMS) {
            String url = (String) form[0];
            String secret = (String) form[1];
            boolean accepted = (Boolean) form[2];
            PostgresDestination destination = PostgresDestination.url(url).table("t").columns("a");
            List<String> problems = destination.problems();
            String shown = destination.toString();
            if (accepted) {
                assertThat(problems).as("problems of %s", url).isEmpty();
                assertThat(shown).as("an accepted URL is shown as it is").contains(url);
                continue;
            }
            assertThat(problems).as("problems of %s", url).hasSize(1);
            String built = catchThrowable(() -> TwopcSink.<String>forPostgres(destination)
                    .setSinkId("orders")
                    .setSerializationSchema(new SimpleStringSchema())
                    .build()).getMessage();
            assertThat(built).as("build() of %s", url).contains(problems.get(0));
            if (!secret.isEmpty()) {
                for (String rendering : new String[] {problems.get(0), shown, built}) {
                    assertThat(rendering).as("a rendering of %s", url).doesNotContain(secret);
                }
            }
            if (url.contains("Tail9")) {
                assertThat(problems.get(0) + shown).as("renderings of %s", url).doesNotContain("Tail9");
            }
        }
    }

    @Test
    public void refusalsSayWhereThePasswordGoesInstead() {
        String userInfo = PostgresDestination.url("postgres://app:s3cret@db/shop").table("t").columns("a")
                .problems().get(0);
        assertThat(userInfo).contains("carries a password", "passwordFromEnvironment", "passwordFromSystemProperty",
                "postgres://app:***@db/shop");
        String keyValue = PostgresDestination.url("host=db password = 'a b' user=app").table("t").columns("a")
                .problems().get(0);
        assertThat(keyValue).contains("sets password", "host=db password=*** user=app", "passwordFromEnvironment");
        assertThat(PostgresDestination.url("postgres://app@db/x@y").table("t").columns("a").problems())
                .singleElement().asString().contains("%40");
        assertThat(PostgresDestination.url("postgres://app@db:port/x").table("t").columns("a").problems())
                .singleElement().asString().contains("not a valid URL");
        assertThat(PostgresDestination.url("host=db 'user").table("t").columns("a").problems())
                .singleElement().asString().contains("not shown");
        assertThat(PostgresDestination.url("host=db user=app user = 'b'").table("t").columns("a").problems())
                .singleElement().asString().contains("sets user twice", "host=db user=app user=b");
        assertThat(PostgresDestination.url("host=a host=b").table("t").columns("a").problems())
                .singleElement().asString().contains("host=a,b", "a list of both");
        assertThat(PostgresDestination.url("postgres://app@db/shop?user=b").table("t").columns("a").problems())
                .singleElement().asString().contains("sets user twice", "'username'");
        assertThat(PostgresDestination.url("postgres://app@db/shop?dbname=x").table("t").columns("a").problems())
                .singleElement().asString().contains("sets dbname twice", "path");
    }

    @Test
    public void thePasswordIsReadWhereTheSinkRuns() {
        String property = "twopc.test.password." + System.nanoTime();
        PostgresDestination fromProperty = orders().passwordFromSystemProperty(property);
        assertThatThrownBy(fromProperty::resolvePassword)
                .isInstanceOf(TwopcConfigException.class)
                .hasMessageContaining("system property " + property + ", which is not set");
        System.setProperty(property, "from-a-property");
        try {
            assertThat(fromProperty.resolvePassword()).isEqualTo("from-a-property");
            assertThat(fromProperty.toString())
                    .contains("password from system property " + property)
                    .doesNotContain("from-a-property");
        } finally {
            System.clearProperty(property);
        }

        PostgresDestination fromEnvironment = orders().passwordFromEnvironment("TWOPC_TEST_NO_SUCH_VARIABLE_7f3a");
        assertThatThrownBy(fromEnvironment::resolvePassword)
                .isInstanceOf(TwopcConfigException.class)
                .hasMessageContaining("environment variable TWOPC_TEST_NO_SUCH_VARIABLE_7f3a, which is not set");
        assertThat(orders().resolvePassword()).as("no password configured").isNull();
    }

    private static void assertProblem(PostgresDestination destination, String expected) {
        assertThat(destination.problems()).as("problems of %s", destination)
                .anySatisfy(p -> assertThat(p).contains(expected));
    }
}
